package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/idemref/payments/internal/tooling/pgtmp"
)

// db/schema.sql is what the migrations produce, so make test finds a stale
// file as make verify does; and a stale file is refused with the remedy.
func TestSchemaIsCurrent(t *testing.T) {
	t.Parallel()
	if _, err := pgtmp.FindBinDir(); err != nil && os.Getenv("TEST_DATABASE_URL") != "" {
		t.Skipf("no PostgreSQL server binaries here to generate the schema with (make verify checks it): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pgDump, err := findPgDump()
	if err != nil {
		t.Fatal(err)
	}
	schema, err := generate(ctx, pgDump)
	if err != nil {
		t.Fatal(err)
	}
	if err := compare("../../db/schema.sql", schema); err != nil {
		t.Fatal(err)
	}

	stale := filepath.Join(t.TempDir(), "schema.sql")
	edited := bytes.Replace(schema, []byte("CREATE TABLE public.payments ("), []byte("CREATE TABLE public.payment ("), 1)
	if err := os.WriteFile(stale, edited, 0o600); err != nil {
		t.Fatal(err)
	}
	err = compare(stale, schema)
	if err == nil || !strings.Contains(err.Error(), "run make generate") || !strings.Contains(err.Error(), "CREATE TABLE public.payment (") {
		t.Errorf("compare(a stale file) = %v, want the differing line and the remedy", err)
	}
}

// What pg_dump prints for one table, one function and the table's rows
// becomes one function, then the table with its constraint, index, trigger
// and rows, without the settings, versions and restrict keys.
func TestNormalize(t *testing.T) {
	t.Parallel()
	dump := `--
-- PostgreSQL database dump
--

\restrict abc123

-- Dumped from database version 15.20
-- Dumped by pg_dump version 15.20

SET statement_timeout = 0;
SELECT pg_catalog.set_config('search_path', '', false);

--
-- Name: f(text, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.f(a text, b timestamp with time zone) RETURNS boolean
    LANGUAGE sql
    AS $$ SELECT true $$;


SET default_tablespace = '';

--
-- Name: things; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.things (
    id integer NOT NULL
);


--
-- Name: things things_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.things
    ADD CONSTRAINT things_pkey PRIMARY KEY (id);


--
-- Name: things_id_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX things_id_idx ON public.things USING btree (id);


--
-- Name: things things_guard; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER things_guard BEFORE UPDATE ON public.things FOR EACH ROW EXECUTE FUNCTION public.g();


--
-- PostgreSQL database dump complete
--

\unrestrict abc123

--
-- PostgreSQL database dump
--

\restrict def456

SET statement_timeout = 0;

--
-- Data for Name: things; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.things (id) VALUES
	(1);


--
-- PostgreSQL database dump complete
--

\unrestrict def456

`
	want := header + `
-- Functions

CREATE FUNCTION public.f(a text, b timestamp with time zone) RETURNS boolean
    LANGUAGE sql
    AS $$ SELECT true $$;

-- Table things

CREATE TABLE public.things (
    id integer NOT NULL
);

ALTER TABLE ONLY public.things
    ADD CONSTRAINT things_pkey PRIMARY KEY (id);

CREATE INDEX things_id_idx ON public.things USING btree (id);

CREATE TRIGGER things_guard BEFORE UPDATE ON public.things FOR EACH ROW EXECUTE FUNCTION public.g();

INSERT INTO public.things (id) VALUES
	(1);
`
	if diff := cmp.Diff(want, string(normalize([]byte(dump)))); diff != "" {
		t.Errorf("normalize (-want +got):\n%s", diff)
	}
}
