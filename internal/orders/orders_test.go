package orders_test

import (
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemref/payments/internal/orders"
	"github.com/idemref/payments/internal/tenants"
	"github.com/idemref/payments/internal/tooling/testdb"
	"github.com/idemref/payments/internal/validation"
)

func TestMain(m *testing.M) { testdb.Main(m) }

type bundle struct {
	tx       pgx.Tx
	tenantID uuid.UUID
}

// setup returns a transaction rolled back when the test ends, with a fresh
// tenant in it.
func setup(t *testing.T) *bundle {
	t.Helper()
	tx := testdb.Tx(t)
	return &bundle{tx: tx, tenantID: newTenant(t, tx)}
}

func newTenant(t *testing.T, tx pgx.Tx) uuid.UUID {
	t.Helper()
	id, _, err := tenants.Create(t.Context(), tx, "Acme "+uuid.NewString())
	if err != nil {
		t.Fatalf("create tenant: %v", err)
	}
	return id
}

// validInput returns a create request that passes validation.
func validInput() orders.CreateInput {
	return orders.CreateInput{
		Reference:   "ord-1",
		CustomerID:  "cus-1",
		Amount:      1250,
		Currency:    "EUR",
		Description: "Two coffees",
		Metadata:    map[string]string{"table": "7"},
	}
}

// Messages of Validate, spelled out so that a change to them is a
// deliberate change to the API.
const (
	msgRequired     = "is required"
	msgIDTooLong    = "must be at most 128 characters"
	msgAmount       = "must be a positive integer amount in minor units, at most 99999999"
	msgCurrency     = "must be an ISO 4217 currency code in upper case, such as EUR"
	msgDescription  = "must be at most 1000 characters"
	msgTooManyKeys  = "must have at most 50 keys"
	msgKeyLength    = "keys must be 1 to 40 characters"
	msgValueTooLong = "values must be at most 500 characters"
	msgControl      = "must not contain control or bidirectional formatting characters"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	// Multi-byte runes prove that limits count characters, not bytes.
	runes := func(n int) string { return strings.Repeat("é", n) }
	metadata := func(n int) map[string]string {
		m := make(map[string]string, n)
		for i := range n {
			m[fmt.Sprintf("k%d", i)] = "v"
		}
		return m
	}
	tests := []struct {
		name   string
		modify func(in *orders.CreateInput)
		want   []validation.FieldError // nil: valid
	}{
		{name: "ValidRequest", modify: func(*orders.CreateInput) {}},
		{name: "MinimalRequest", modify: func(in *orders.CreateInput) { in.Description, in.Metadata = "", nil }},
		{
			name:   "ReferenceRequired",
			modify: func(in *orders.CreateInput) { in.Reference = "" },
			want:   []validation.FieldError{{Field: "reference", Message: msgRequired}},
		},
		{name: "ReferenceAt128Characters", modify: func(in *orders.CreateInput) { in.Reference = runes(128) }},
		{
			name:   "ReferenceOver128Characters",
			modify: func(in *orders.CreateInput) { in.Reference = runes(129) },
			want:   []validation.FieldError{{Field: "reference", Message: msgIDTooLong}},
		},
		{
			name:   "CustomerIDRequired",
			modify: func(in *orders.CreateInput) { in.CustomerID = "" },
			want:   []validation.FieldError{{Field: "customer_id", Message: msgRequired}},
		},
		{name: "CustomerIDAt128Characters", modify: func(in *orders.CreateInput) { in.CustomerID = runes(128) }},
		{
			name:   "CustomerIDOver128Characters",
			modify: func(in *orders.CreateInput) { in.CustomerID = runes(129) },
			want:   []validation.FieldError{{Field: "customer_id", Message: msgIDTooLong}},
		},
		// R7: text that misleads whoever reads it later is refused.
		{
			name:   "ReferenceWhitespaceOnly",
			modify: func(in *orders.CreateInput) { in.Reference = " \t " },
			want:   []validation.FieldError{{Field: "reference", Message: msgRequired}},
		},
		{
			name:   "ReferenceWithBell",
			modify: func(in *orders.CreateInput) { in.Reference = "ord\a-1" },
			want:   []validation.FieldError{{Field: "reference", Message: msgControl}},
		},
		{
			name:   "ReferenceWithEscape",
			modify: func(in *orders.CreateInput) { in.Reference = "ord\x1b[31m-1" },
			want:   []validation.FieldError{{Field: "reference", Message: msgControl}},
		},
		{
			name:   "ReferenceWithLineBreak",
			modify: func(in *orders.CreateInput) { in.Reference = "ord-1\r\nX-Forged: yes" },
			want:   []validation.FieldError{{Field: "reference", Message: msgControl}},
		},
		{
			name:   "CustomerIDWithRightToLeftOverride",
			modify: func(in *orders.CreateInput) { in.CustomerID = "cus_\u202egnp.exe" },
			want:   []validation.FieldError{{Field: "customer_id", Message: msgControl}},
		},
		{
			name:   "CustomerIDWithC1Control",
			modify: func(in *orders.CreateInput) { in.CustomerID = "cus_\u0085" },
			want:   []validation.FieldError{{Field: "customer_id", Message: msgControl}},
		},
		{name: "DescriptionWithLineBreaks", modify: func(in *orders.CreateInput) { in.Description = "two\nlines\tand a tab" }},
		{
			name:   "DescriptionWithIsolate",
			modify: func(in *orders.CreateInput) { in.Description = "a \u2067b\u2069" },
			want:   []validation.FieldError{{Field: "description", Message: msgControl}},
		},
		{
			name:   "MetadataValueWithNUL",
			modify: func(in *orders.CreateInput) { in.Metadata = map[string]string{"k": "v\x00"} },
			want:   []validation.FieldError{{Field: "metadata", Message: msgControl}},
		},
		{name: "AmountAtTheCeiling", modify: func(in *orders.CreateInput) { in.Amount = 99_999_999 }},
		{
			name:   "AmountOverTheCeiling",
			modify: func(in *orders.CreateInput) { in.Amount = 100_000_000 },
			want:   []validation.FieldError{{Field: "amount", Message: msgAmount}},
		},
		{
			name:   "AmountAtInt64Max",
			modify: func(in *orders.CreateInput) { in.Amount = 1<<63 - 1 },
			want:   []validation.FieldError{{Field: "amount", Message: msgAmount}},
		},
		{
			name:   "ZeroAmount",
			modify: func(in *orders.CreateInput) { in.Amount = 0 },
			want:   []validation.FieldError{{Field: "amount", Message: msgAmount}},
		},
		{
			name:   "NegativeAmount",
			modify: func(in *orders.CreateInput) { in.Amount = -1 },
			want:   []validation.FieldError{{Field: "amount", Message: msgAmount}},
		},
		{
			name:   "LowerCaseCurrency",
			modify: func(in *orders.CreateInput) { in.Currency = "eur" },
			want:   []validation.FieldError{{Field: "currency", Message: msgCurrency}},
		},
		{
			name:   "UnknownCurrency",
			modify: func(in *orders.CreateInput) { in.Currency = "XXZ" },
			want:   []validation.FieldError{{Field: "currency", Message: msgCurrency}},
		},
		{
			name:   "MissingCurrency",
			modify: func(in *orders.CreateInput) { in.Currency = "" },
			want:   []validation.FieldError{{Field: "currency", Message: msgCurrency}},
		},
		{name: "DescriptionAt1000Characters", modify: func(in *orders.CreateInput) { in.Description = runes(1000) }},
		{
			name:   "DescriptionOver1000Characters",
			modify: func(in *orders.CreateInput) { in.Description = runes(1001) },
			want:   []validation.FieldError{{Field: "description", Message: msgDescription}},
		},
		{name: "MetadataWith50Keys", modify: func(in *orders.CreateInput) { in.Metadata = metadata(50) }},
		{
			name:   "MetadataWith51Keys",
			modify: func(in *orders.CreateInput) { in.Metadata = metadata(51) },
			want:   []validation.FieldError{{Field: "metadata", Message: msgTooManyKeys}},
		},
		{
			name:   "MetadataEmptyKey",
			modify: func(in *orders.CreateInput) { in.Metadata = map[string]string{"": "v"} },
			want:   []validation.FieldError{{Field: "metadata", Message: msgKeyLength}},
		},
		{name: "MetadataKeyAt40Characters", modify: func(in *orders.CreateInput) { in.Metadata = map[string]string{runes(40): "v"} }},
		{
			name:   "MetadataKeyOver40Characters",
			modify: func(in *orders.CreateInput) { in.Metadata = map[string]string{runes(41): "v"} },
			want:   []validation.FieldError{{Field: "metadata", Message: msgKeyLength}},
		},
		{name: "MetadataEmptyValue", modify: func(in *orders.CreateInput) { in.Metadata = map[string]string{"k": ""} }},
		{name: "MetadataValueAt500Characters", modify: func(in *orders.CreateInput) { in.Metadata = map[string]string{"k": runes(500)} }},
		{
			name:   "MetadataValueOver500Characters",
			modify: func(in *orders.CreateInput) { in.Metadata = map[string]string{"k": runes(501)} },
			want:   []validation.FieldError{{Field: "metadata", Message: msgValueTooLong}},
		},
		{
			name: "SeveralBadMetadataEntriesReportedOncePerRule",
			modify: func(in *orders.CreateInput) {
				in.Metadata = map[string]string{"": "v", runes(41): "v", "a": runes(501), "b": runes(501)}
			},
			want: []validation.FieldError{
				{Field: "metadata", Message: msgKeyLength},
				{Field: "metadata", Message: msgValueTooLong},
			},
		},
		{
			name: "EveryProblemListedAtOnce",
			modify: func(in *orders.CreateInput) {
				*in = orders.CreateInput{
					Reference:   "",
					CustomerID:  runes(129),
					Amount:      0,
					Currency:    "EURO",
					Description: runes(1001),
					Metadata:    metadata(51),
				}
				in.Metadata[""] = runes(501)
			},
			want: []validation.FieldError{
				{Field: "reference", Message: msgRequired},
				{Field: "customer_id", Message: msgIDTooLong},
				{Field: "amount", Message: msgAmount},
				{Field: "currency", Message: msgCurrency},
				{Field: "description", Message: msgDescription},
				{Field: "metadata", Message: msgTooManyKeys},
				{Field: "metadata", Message: msgKeyLength},
				{Field: "metadata", Message: msgValueTooLong},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := validInput()
			tt.modify(&in)
			err := orders.Validate(in)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			var verr *validation.Error
			if !errors.As(err, &verr) {
				t.Fatalf("Validate = %v, want a *validation.Error", err)
			}
			if diff := cmp.Diff(tt.want, verr.Fields); diff != "" {
				t.Errorf("field errors (-want +got):\n%s", diff)
			}
		})
	}
}

// ignoreGenerated leaves out what the database or the clock decides.
var ignoreGenerated = cmpopts.IgnoreFields(orders.Order{}, "ID", "CreatedAt")

func TestCreate(t *testing.T) {
	t.Parallel()

	t.Run("InsertsAndReturnsTheOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		got, err := orders.Create(t.Context(), b.tx, b.tenantID, validInput())
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		want := orders.Order{
			Reference:   "ord-1",
			CustomerID:  "cus-1",
			Amount:      1250,
			Currency:    "EUR",
			Description: "Two coffees",
			Metadata:    map[string]string{"table": "7"},
			Status:      orders.StatusPending,
			AmountPaid:  0,
		}
		if diff := cmp.Diff(want, got, ignoreGenerated); diff != "" {
			t.Errorf("created order (-want +got):\n%s", diff)
		}
		if got.ID == uuid.Nil || got.CreatedAt.IsZero() {
			t.Errorf("created order has ID %v and CreatedAt %v, want both set", got.ID, got.CreatedAt)
		}
		stored, err := orders.Get(t.Context(), b.tx, b.tenantID, got.ID)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if diff := cmp.Diff(got, stored); diff != "" {
			t.Errorf("stored order differs from the returned one (-returned +stored):\n%s", diff)
		}
	})

	t.Run("DefaultsDescriptionAndMetadataToEmpty", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		in := validInput()
		in.Description, in.Metadata = "", nil
		created, err := orders.Create(t.Context(), b.tx, b.tenantID, in)
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		stored, err := orders.Get(t.Context(), b.tx, b.tenantID, created.ID)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		for _, got := range []orders.Order{created, stored} {
			if diff := cmp.Diff(map[string]string{}, got.Metadata); diff != "" {
				t.Errorf("metadata (-want +got):\n%s", diff)
			}
			if got.Description != "" {
				t.Errorf("description = %q, want empty", got.Description)
			}
		}
		var raw string
		if err := b.tx.QueryRow(t.Context(), "SELECT metadata::text FROM orders WHERE id = $1", created.ID).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff("{}", raw); diff != "" {
			t.Errorf("stored metadata column (-want +got):\n%s", diff)
		}
	})

	t.Run("RejectsInvalidRequestWithoutWriting", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		in := validInput()
		in.Amount = 0
		_, err := orders.Create(t.Context(), b.tx, b.tenantID, in)
		var verr *validation.Error
		if !errors.As(err, &verr) {
			t.Fatalf("Create = %v, want a *validation.Error", err)
		}
		if n := countOrders(t, b.tx, b.tenantID); n != 0 {
			t.Errorf("%d orders stored after a rejected create, want 0", n)
		}
	})

	t.Run("SameReferenceReturnsTheExistingOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first, err := orders.Create(t.Context(), b.tx, b.tenantID, validInput())
		if err != nil {
			t.Fatalf("first Create: %v", err)
		}
		// A retry under a new idempotency key, possibly with other details:
		// the reference alone decides.
		again := validInput()
		again.Amount = 999
		_, err = orders.Create(t.Context(), b.tx, b.tenantID, again)
		var exists *orders.ReferenceExistsError
		if !errors.As(err, &exists) {
			t.Fatalf("second Create = %v, want a *ReferenceExistsError", err)
		}
		if exists.OrderID != first.ID {
			t.Errorf("ReferenceExistsError.OrderID = %v, want the first order's %v", exists.OrderID, first.ID)
		}
		if n := countOrders(t, b.tx, b.tenantID); n != 1 {
			t.Errorf("%d orders stored for the reference, want 1", n)
		}
		stored, err := orders.Get(t.Context(), b.tx, b.tenantID, first.ID)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if diff := cmp.Diff(first, stored); diff != "" {
			t.Errorf("the duplicate changed the first order (-first +stored):\n%s", diff)
		}
	})

	t.Run("SameReferenceUnderAnotherTenantIsANewOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		other := newTenant(t, b.tx)
		mine, err := orders.Create(t.Context(), b.tx, b.tenantID, validInput())
		if err != nil {
			t.Fatalf("Create for the first tenant: %v", err)
		}
		theirs, err := orders.Create(t.Context(), b.tx, other, validInput())
		if err != nil {
			t.Fatalf("Create for the other tenant: %v", err)
		}
		if mine.ID == theirs.ID {
			t.Errorf("both tenants got order %v", mine.ID)
		}
		for _, tenant := range []uuid.UUID{b.tenantID, other} {
			if n := countOrders(t, b.tx, tenant); n != 1 {
				t.Errorf("tenant %v has %d orders, want 1", tenant, n)
			}
		}
	})
}

func TestGet(t *testing.T) {
	t.Parallel()

	t.Run("AnotherTenantsOrderIsNotFound", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		other := newTenant(t, b.tx)
		theirs, err := orders.Create(t.Context(), b.tx, other, validInput())
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		if got, err := orders.Get(t.Context(), b.tx, b.tenantID, theirs.ID); !errors.Is(err, orders.ErrNotFound) {
			t.Errorf("Get(another tenant's order) = %+v, %v; want ErrNotFound", got, err)
		}
	})

	t.Run("UnknownOrderIsNotFound", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if got, err := orders.Get(t.Context(), b.tx, b.tenantID, uuid.New()); !errors.Is(err, orders.ErrNotFound) {
			t.Errorf("Get(unknown id) = %+v, %v; want ErrNotFound", got, err)
		}
	})
}

func TestList(t *testing.T) {
	t.Parallel()

	t.Run("EmptyForATenantWithoutOrders", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		page, err := orders.List(t.Context(), b.tx, b.tenantID, "", 3)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if diff := cmp.Diff(orders.Page{Orders: []orders.Order{}}, page); diff != "" {
			t.Errorf("page (-want +got):\n%s", diff)
		}
	})

	t.Run("ReturnsTheOrdersThemselves", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		created, err := orders.Create(t.Context(), b.tx, b.tenantID, validInput())
		if err != nil {
			t.Fatal(err)
		}
		page, err := orders.List(t.Context(), b.tx, b.tenantID, "", 3)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if diff := cmp.Diff(orders.Page{Orders: []orders.Order{created}}, page); diff != "" {
			t.Errorf("page (-want +got):\n%s", diff)
		}
	})

	// Every order of one transaction gets the same created_at (now() is
	// the transaction's start), so the id alone orders them; the second
	// case spreads created_at against the creation order to prove that
	// created_at comes first.
	tests := []struct {
		name string
		// ageOrders, when set, rewrites created_at of the orders, given in
		// creation order, and returns them in the order List must return.
		ageOrders func(t *testing.T, tx pgx.Tx, created []uuid.UUID) []uuid.UUID
	}{
		{name: "CreatedInOneInstantNewestIDFirst"},
		{name: "NewestCreatedAtFirst", ageOrders: ageAgainstCreationOrder},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			other := newTenant(t, b.tx)
			var created []uuid.UUID
			for i := range 7 {
				in := validInput()
				in.Reference = fmt.Sprintf("ord-%d", i)
				o, err := orders.Create(t.Context(), b.tx, b.tenantID, in)
				if err != nil {
					t.Fatalf("Create: %v", err)
				}
				created = append(created, o.ID)
				// Interleaved orders of another tenant must not show up.
				if _, err := orders.Create(t.Context(), b.tx, other, in); err != nil {
					t.Fatalf("Create for the other tenant: %v", err)
				}
			}
			want := slices.Clone(created)
			slices.Reverse(want)
			if tt.ageOrders != nil {
				want = tt.ageOrders(t, b.tx, created)
			}

			var got []uuid.UUID
			var sizes []int
			cursor := ""
			for range len(created) + 1 { // bounded, in case cursors loop
				page, err := orders.List(t.Context(), b.tx, b.tenantID, cursor, 3)
				if err != nil {
					t.Fatalf("List(cursor %q): %v", cursor, err)
				}
				sizes = append(sizes, len(page.Orders))
				for _, o := range page.Orders {
					got = append(got, o.ID)
				}
				if page.NextCursor == "" {
					break
				}
				cursor = page.NextCursor
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("ids across pages (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]int{3, 3, 1}, sizes); diff != "" {
				t.Errorf("page sizes (-want +got):\n%s", diff)
			}
		})
	}

	t.Run("LastFullPageHasNoCursor", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for i := range 3 {
			in := validInput()
			in.Reference = fmt.Sprintf("ord-%d", i)
			if _, err := orders.Create(t.Context(), b.tx, b.tenantID, in); err != nil {
				t.Fatal(err)
			}
		}
		page, err := orders.List(t.Context(), b.tx, b.tenantID, "", 3)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if len(page.Orders) != 3 || page.NextCursor != "" {
			t.Errorf("List = %d orders, cursor %q; want 3 orders and no cursor", len(page.Orders), page.NextCursor)
		}
	})

	t.Run("RejectsCursorsItDidNotIssue", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b64 := base64.RawURLEncoding.EncodeToString
		id := uuid.New().String()
		tests := []struct {
			name   string
			cursor string
		}{
			{name: "NotBase64", cursor: "x"},
			{name: "PaddedStandardBase64", cursor: base64.StdEncoding.EncodeToString([]byte("1_" + id))},
			{name: "Base64OfGarbage", cursor: b64([]byte("garbage"))},
			{name: "NoSeparator", cursor: b64([]byte("1700000000000000000"))},
			{name: "EmptyTime", cursor: b64([]byte("_" + id))},
			{name: "TimeNotANumber", cursor: b64([]byte("yesterday_" + id))},
			{name: "TimeWithTrailingGarbage", cursor: b64([]byte("17x_" + id))},
			{name: "TimeWithSpaces", cursor: b64([]byte(" 17 _" + id))},
			{name: "WrongUUID", cursor: b64([]byte("1700000000000000000_not-a-uuid"))},
			{name: "EmptyUUID", cursor: b64([]byte("1700000000000000000_"))},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				// Not parallel: the subtests share the parent's transaction,
				// and a pgx connection runs one query at a time.
				page, err := orders.List(t.Context(), b.tx, b.tenantID, tt.cursor, 3)
				if !errors.Is(err, orders.ErrInvalidCursor) {
					t.Errorf("List(cursor %q) = %+v, %v; want ErrInvalidCursor", tt.cursor, page, err)
				}
			})
		}
	})
}

// ageAgainstCreationOrder gives the orders distinct created_at values, the
// first created the newest, and returns the ids newest first.
func ageAgainstCreationOrder(t *testing.T, tx pgx.Tx, created []uuid.UUID) []uuid.UUID {
	t.Helper()
	for i, id := range created {
		// Microsecond steps, the precision of timestamptz, so the cursor
		// must carry created_at exactly.
		if _, err := tx.Exec(t.Context(),
			"UPDATE orders SET created_at = created_at - make_interval(secs => $2 * 0.000001) WHERE id = $1",
			id, i); err != nil {
			t.Fatalf("age order: %v", err)
		}
	}
	return slices.Clone(created)
}

func countOrders(t *testing.T, tx pgx.Tx, tenantID uuid.UUID) int {
	t.Helper()
	var n int
	if err := tx.QueryRow(t.Context(), "SELECT count(*) FROM orders WHERE tenant_id = $1", tenantID).Scan(&n); err != nil {
		t.Fatalf("count orders: %v", err)
	}
	return n
}
