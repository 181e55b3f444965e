package deploy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// sbomLabel is the prefix of the image's labels that name its SBOM (the
// Makefile's SBOM_LABEL).
const sbomLabel = "io.github.idemref.payments.sbom"

// ociDescriptor is an entry of an OCI layout's index or a manifest's
// config or layer.
type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Annotations map[string]string `json:"annotations"`
}

// testPush: make image-push to a local OCI layout (REGISTRY=oci:DIR), as
// to a registry, and the layout read back as a registry client would: the
// image at its version tag, whose label holds the SBOM's digest, and the
// SBOM's image at <tag>.sbom, whose one file has that digest and is the
// CycloneDX SBOM of the binary: every module go version -m finds in it,
// and nothing else.
func testPush(t *testing.T, p *podman, img image) {
	layout := filepath.Join(t.TempDir(), "layout")
	cmd := exec.Command("make", "-C", "..", "--no-print-directory", "image-push", "IMAGE="+img.name, "BIN="+img.bin, "CONTAINER=podman --runtime runc", "REGISTRY=oci:"+layout)
	cmd.Env = p.env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make image-push: %v\n%s", err, out)
	}
	var index struct{ Manifests []ociDescriptor }
	readBlobJSON(t, filepath.Join(layout, "index.json"), &index)
	name := path.Base(img.name)
	manifest := func(ref string) (m struct {
		Config ociDescriptor
		Layers []ociDescriptor
	}) {
		for _, d := range index.Manifests {
			if d.Annotations["org.opencontainers.image.ref.name"] == ref {
				readBlobJSON(t, blobPath(layout, d.Digest), &m)
				return m
			}
		}
		t.Fatalf("the OCI layout has no %s: %+v", ref, index.Manifests)
		return m
	}

	var config struct {
		Config struct{ Labels map[string]string }
	}
	readBlobJSON(t, blobPath(layout, manifest(name+":"+img.tag).Config.Digest), &config)
	labels := config.Config.Labels
	if labels["org.opencontainers.image.version"] != img.version {
		t.Errorf("the pushed image's version label is %q, want %q", labels["org.opencontainers.image.version"], img.version)
	}
	if got := labels[sbomLabel+".tag"]; got != img.tag+".sbom" {
		t.Errorf("the image's label %s.tag = %q, want %s.sbom", sbomLabel, got, img.tag)
	}
	sbomImage := manifest(name + ":" + img.tag + ".sbom")
	if len(sbomImage.Layers) != 1 {
		t.Fatalf("the SBOM's image has %d layers, want 1", len(sbomImage.Layers))
	}
	sbom := layerFile(t, layout, sbomImage.Layers[0], "sbom.cdx.json")
	sum := sha256.Sum256(sbom)
	if want := labels[sbomLabel+".digest"]; want != "sha256:"+hex.EncodeToString(sum[:]) {
		t.Errorf("the image's label %s.digest = %q, but the pushed SBOM's is sha256:%x", sbomLabel, want, sum)
	}
	written, err := os.ReadFile(filepath.Join(img.bin, "sbom.cdx.json"))
	if err != nil || !bytes.Equal(written, sbom) {
		t.Errorf("the pushed SBOM is not the one make image wrote beside the image (%v)", err)
	}

	var doc struct {
		BOMFormat   string `json:"bomFormat"`
		SpecVersion string `json:"specVersion"`
		Metadata    struct {
			Component struct{ Name, Version string }
		}
		Components []struct{ Name, Version string }
	}
	if err := json.Unmarshal(sbom, &doc); err != nil {
		t.Fatalf("the SBOM: %v", err)
	}
	if doc.BOMFormat != "CycloneDX" || doc.Metadata.Component.Version != img.version {
		t.Errorf("the SBOM is %q %s of %s %s, want CycloneDX of the module at %s", doc.BOMFormat, doc.SpecVersion, doc.Metadata.Component.Name, doc.Metadata.Component.Version, img.version)
	}
	var components []string
	for _, c := range doc.Components {
		components = append(components, c.Name+"@"+c.Version)
	}
	slices.Sort(components)
	if deps := binaryDeps(t, filepath.Join(img.bin, "image", "api")); !slices.Equal(components, deps) {
		t.Errorf("the SBOM's components are not the binary's modules:\n SBOM   %v\n binary %v", components, deps)
	}
	t.Logf("make image-push REGISTRY=oci:%s: %s:%s and %s:%s.sbom read back; the SBOM (CycloneDX %s, sha256:%x, the image's label) lists %d components, the binary's modules",
		layout, name, img.tag, name, img.tag, doc.SpecVersion, sum, len(doc.Components))
}

// binaryDeps are the modules the go command recorded in a binary
// (go version -m), as path@version.
func binaryDeps(t *testing.T, binary string) []string {
	t.Helper()
	out, err := exec.Command("go", "version", "-m", binary).Output()
	if err != nil {
		t.Fatalf("go version -m %s: %v", binary, err)
	}
	var deps []string
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "dep" {
			deps = append(deps, f[1]+"@"+f[2])
		}
	}
	slices.Sort(deps)
	return deps
}

func blobPath(layout, digest string) string {
	algo, hexDigest, _ := strings.Cut(digest, ":")
	return filepath.Join(layout, "blobs", algo, hexDigest)
}

func readBlobJSON(t *testing.T, file string, v any) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// layerFile returns one file of a layer, a tar, gzip-compressed or not
// as its media type says.
func layerFile(t *testing.T, layout string, layer ociDescriptor, name string) []byte {
	t.Helper()
	f, err := os.Open(blobPath(layout, layer.Digest))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(layer.MediaType, "+gzip") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		r = gz
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("the layer %s has no %s", layer.Digest, name)
		}
		if err != nil {
			t.Fatal(err)
		}
		if path.Clean(h.Name) == name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}
