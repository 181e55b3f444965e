package deploy

import (
	"bytes"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

// manifestDir holds the Kustomize base (base/, one object per file) and
// the overlays a team applies (overlays/<name>).
const manifestDir = "kubernetes"

// placeholder marks every value a team must fill in before applying the
// production overlay.
const placeholder = "FILL-IN"

// The overlays, and the kinds each renders: dev runs one pod on the
// host's network (no Service, no budget, no Secret: the recipe creates a
// Podman secret), production everything a cluster needs.
var overlayKinds = map[string][]string{
	"dev":        {"ConfigMap", "Deployment", "Job"},
	"production": {"ConfigMap", "Secret", "Deployment", "Service", "Job", "PodDisruptionBudget"},
}

// manifests are the objects an overlay renders, decoded; a kind the
// overlay does not render is nil.
type manifests struct {
	ConfigMap  *corev1.ConfigMap
	Secret     *corev1.Secret
	Deployment *appsv1.Deployment
	Service    *corev1.Service
	Job        *batchv1.Job
	PDB        *policyv1.PodDisruptionBudget
}

// kustomizeCommand is the kustomize CLI the Makefile pins (KUSTOMIZE), so
// that the tests render with the version make manifests runs.
func kustomizeCommand(t *testing.T) []string {
	t.Helper()
	makefile, err := os.ReadFile(filepath.Join("..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^KUSTOMIZE := \$\(GO\) run (\S+@v\S+)$`).FindSubmatch(makefile)
	if m == nil {
		t.Fatal("the Makefile has no KUSTOMIZE := $(GO) run <module>@<version> line")
	}
	return []string{"go", "run", string(m[1])}
}

// kustomize runs kustomize build on dir and returns what it printed, or
// its error with what it said.
func kustomize(t *testing.T, dir string) ([]byte, error) {
	t.Helper()
	args := append(kustomizeCommand(t), "build", dir)
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w\n%s", dir, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// overlayCopy copies manifestDir into a temporary folder and returns the
// overlay's folder there. For production it copies each *.env.example to
// its *.env, as a team starts: the rendered objects then hold the
// placeholders the examples mark.
func overlayCopy(t *testing.T, overlay string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "kubernetes")
	if err := os.CopyFS(dir, os.DirFS(manifestDir)); err != nil {
		t.Fatal(err)
	}
	od := filepath.Join(dir, "overlays", overlay)
	examples, _ := filepath.Glob(filepath.Join(od, "*.env.example"))
	for _, ex := range examples {
		b, err := os.ReadFile(ex)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(strings.TrimSuffix(ex, ".example"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return od
}

var (
	renderedMu sync.Mutex
	rendered   = map[string][]byte{}
)

// render is kustomize build of an overlay (from overlayCopy), once per
// test binary.
func render(t *testing.T, overlay string) []byte {
	t.Helper()
	renderedMu.Lock()
	defer renderedMu.Unlock()
	if out, ok := rendered[overlay]; ok {
		return out
	}
	out, err := kustomize(t, overlayCopy(t, overlay))
	if err != nil {
		t.Fatal(err)
	}
	rendered[overlay] = out
	return out
}

// loadManifests renders an overlay and decodes every object strictly into
// the real Kubernetes API type its kind and apiVersion name: a field the
// type does not have, a duplicate key, a kind the overlay should not
// render or a second object of one kind fails the test.
func loadManifests(t *testing.T, overlay string) *manifests {
	t.Helper()
	m, err := decodeManifests(render(t, overlay), overlayKinds[overlay])
	if err != nil {
		t.Fatalf("overlay %s: %v", overlay, err)
	}
	return m
}

func decodeManifests(stream []byte, kinds []string) (*manifests, error) {
	m := &manifests{}
	// The type each kind decodes into, and the apiVersion it must name.
	targets := map[string]struct {
		apiVersion string
		obj        func() any
	}{
		"ConfigMap":           {"v1", func() any { m.ConfigMap = &corev1.ConfigMap{}; return m.ConfigMap }},
		"Secret":              {"v1", func() any { m.Secret = &corev1.Secret{}; return m.Secret }},
		"Deployment":          {"apps/v1", func() any { m.Deployment = &appsv1.Deployment{}; return m.Deployment }},
		"Service":             {"v1", func() any { m.Service = &corev1.Service{}; return m.Service }},
		"Job":                 {"batch/v1", func() any { m.Job = &batchv1.Job{}; return m.Job }},
		"PodDisruptionBudget": {"policy/v1", func() any { m.PDB = &policyv1.PodDisruptionBudget{}; return m.PDB }},
	}
	seen := map[string]bool{}
	for _, doc := range regexp.MustCompile(`(?m)^---\n`).Split(string(stream), -1) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			return nil, err
		}
		target, ok := targets[head.Kind]
		if !ok || !slices.Contains(kinds, head.Kind) {
			return nil, fmt.Errorf("kind %q: want only %v; add a new kind to overlayKinds and check it", head.Kind, kinds)
		}
		if head.APIVersion != target.apiVersion {
			return nil, fmt.Errorf("%s with apiVersion %q, want %q", head.Kind, head.APIVersion, target.apiVersion)
		}
		if seen[head.Kind] {
			return nil, fmt.Errorf("two objects of kind %s: keep one", head.Kind)
		}
		seen[head.Kind] = true
		if err := yaml.UnmarshalStrict([]byte(doc), target.obj()); err != nil {
			return nil, fmt.Errorf("a %s does not decode strictly into the type of k8s.io/api: %w", head.Kind, err)
		}
	}
	for _, kind := range kinds {
		if !seen[kind] {
			return nil, fmt.Errorf("no %s", kind)
		}
	}
	return m, nil
}

// forEachOverlay runs check as a subtest per overlay.
func forEachOverlay(t *testing.T, check func(t *testing.T, overlay string, m *manifests)) {
	for _, overlay := range slices.Sorted(maps.Keys(overlayKinds)) {
		t.Run(overlay, func(t *testing.T) { check(t, overlay, loadManifests(t, overlay)) })
	}
}

// TestManifestsDecodeStrictly: every manifest is a known kind decoded by
// the real API types with unknown fields refused, and the decoding does
// refuse them (a misspelt field would otherwise be dropped silently, as
// kubectl apply without --validate=strict does).
func TestManifestsDecodeStrictly(t *testing.T) {
	forEachOverlay(t, func(t *testing.T, overlay string, m *manifests) {
		t.Logf("overlay %s: kustomize build rendered %d objects (%v), each decoded strictly: %d replica(s), image %s", overlay,
			len(overlayKinds[overlay]), overlayKinds[overlay], *m.Deployment.Spec.Replicas, m.Deployment.Spec.Template.Spec.Containers[0].Image)
	})
	misspelt := []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replicaz: 3\n")
	if err := yaml.UnmarshalStrict(misspelt, &appsv1.Deployment{}); err == nil {
		t.Error("a Deployment with spec.replicaz decoded without error: the decoding is not strict")
	}
}

// checkLockedDown holds a pod spec to the restricted Pod Security
// Standard and more: not root, no privilege escalation, no capability, the
// runtime's seccomp profile, a read-only root file system, no service
// account token.
func checkLockedDown(t *testing.T, what string, spec corev1.PodSpec, hostNetwork bool) {
	t.Helper()
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Errorf("%s: the pod's securityContext.runAsNonRoot is not true", what)
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: the pod's seccompProfile is not RuntimeDefault", what)
	}
	if psc != nil && psc.RunAsUser != nil && *psc.RunAsUser == 0 {
		t.Errorf("%s: the pod runs as user 0", what)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("%s: automountServiceAccountToken is not false: the API never calls the Kubernetes API", what)
	}
	if (spec.HostNetwork && !hostNetwork) || spec.HostPID || spec.HostIPC {
		t.Errorf("%s: the pod shares a host namespace", what)
	}
	if len(spec.InitContainers) > 0 {
		t.Errorf("%s: init containers are not checked here: check them too", what)
	}
	for _, c := range spec.Containers {
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("%s: container %s has no securityContext", what, c.Name)
			continue
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: container %s: readOnlyRootFilesystem is not true", what, c.Name)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: container %s: allowPrivilegeEscalation is not false", what, c.Name)
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("%s: container %s is privileged", what, c.Name)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
			t.Errorf("%s: container %s does not drop ALL capabilities, or adds one", what, c.Name)
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			t.Errorf("%s: container %s runs as user 0", what, c.Name)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: container %s lacks a CPU or memory request or a memory limit", what, c.Name)
		}
		if len(c.Command) > 0 {
			t.Errorf("%s: container %s replaces the image's entrypoint (command): give the api command in args", what, c.Name)
		}
	}
}

// TestPodsAreLockedDown: the Deployment's and the migration Job's pods.
// The dev overlay alone shares the host's network, where a laptop's
// PostgreSQL and NATS listen on 127.0.0.1.
func TestPodsAreLockedDown(t *testing.T) {
	forEachOverlay(t, func(t *testing.T, overlay string, m *manifests) {
		checkLockedDown(t, "Deployment "+m.Deployment.Name, m.Deployment.Spec.Template.Spec, overlay == "dev")
		checkLockedDown(t, "Job "+m.Job.Name, m.Job.Spec.Template.Spec, overlay == "dev")
	})
}

// apiContainer returns the one container of a pod spec.
func apiContainer(t *testing.T, what string, spec *corev1.PodSpec) *corev1.Container {
	t.Helper()
	if len(spec.Containers) != 1 {
		t.Fatalf("%s has %d containers, want 1", what, len(spec.Containers))
	}
	return &spec.Containers[0]
}

// probePort resolves a probe's port, a number or a port name, to the
// container port.
func probePort(t *testing.T, c *corev1.Container, p *corev1.Probe) int32 {
	t.Helper()
	if p.HTTPGet == nil {
		t.Fatalf("container %s: the probe is not an HTTP GET", c.Name)
	}
	if p.HTTPGet.Port.StrVal == "" {
		return p.HTTPGet.Port.IntVal
	}
	for _, port := range c.Ports {
		if port.Name == p.HTTPGet.Port.StrVal {
			return port.ContainerPort
		}
	}
	t.Fatalf("container %s: the probe's port %q names no container port", c.Name, p.HTTPGet.Port.StrVal)
	return 0
}

// TestDeploymentServesAndStopsInTime: api serve, ready on /readyz and
// alive on /healthz at the port ADDR listens on, and a grace period above
// what a SIGTERM may take by the ConfigMap's settings.
func TestDeploymentServesAndStopsInTime(t *testing.T) {
	forEachOverlay(t, checkServesAndStops)
}

func checkServesAndStops(t *testing.T, overlay string, m *manifests) {
	spec := &m.Deployment.Spec.Template.Spec
	c := apiContainer(t, "the Deployment", spec)
	if !slices.Equal(c.Args, []string{"serve"}) {
		t.Errorf("the Deployment's args are %q, want [serve]", c.Args)
	}
	_, addrPort, err := splitAddr(m.ConfigMap.Data["ADDR"])
	if err != nil {
		t.Fatalf("the ConfigMap's ADDR: %v", err)
	}
	for _, probe := range []struct {
		name, path string
		p          *corev1.Probe
	}{{"readinessProbe", "/readyz", c.ReadinessProbe}, {"livenessProbe", "/healthz", c.LivenessProbe}} {
		if probe.p == nil {
			t.Errorf("the Deployment has no %s", probe.name)
			continue
		}
		if port := probePort(t, c, probe.p); port != addrPort {
			t.Errorf("%s: port %d, but ADDR listens on %d", probe.name, port, addrPort)
		}
		if probe.p.HTTPGet.Path != probe.path {
			t.Errorf("%s: path %q, want %q", probe.name, probe.p.HTTPGet.Path, probe.path)
		}
	}

	// serve's SIGTERM: the grace with /readyz at 503, then SHUTDOWN_TIMEOUT
	// for the requests in flight and again for the workers (cmd/api
	// serve.go).
	duration := func(name string) time.Duration {
		v, ok := m.ConfigMap.Data[name]
		if !ok {
			t.Fatalf("the ConfigMap does not set %s: set it, so that the grace period below is checked against it", name)
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("the ConfigMap's %s: %v", name, err)
		}
		return d
	}
	stop := duration("SHUTDOWN_GRACE") + 2*duration("SHUTDOWN_TIMEOUT")
	grace := spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second <= stop+5*time.Second {
		t.Errorf("terminationGracePeriodSeconds is %v, want above %v (SHUTDOWN_GRACE + 2 × SHUTDOWN_TIMEOUT) with 5 s to spare", derefOr(grace), stop)
	}

	// The Go runtime's soft limit sits under the container's memory limit.
	limit := c.Resources.Limits.Memory().Value()
	var goMemLimit int64
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			goMemLimit, err = parseGoMemLimit(e.Value)
			if err != nil {
				t.Fatalf("GOMEMLIMIT: %v", err)
			}
		}
	}
	if goMemLimit == 0 || goMemLimit >= limit {
		t.Errorf("GOMEMLIMIT is %d bytes, want set and under the memory limit (%d bytes)", goMemLimit, limit)
	}

	rollout := m.Deployment.Spec.Strategy.RollingUpdate
	if rollout == nil || rollout.MaxUnavailable == nil || rollout.MaxUnavailable.IntValue() != 0 {
		t.Error("the rolling update may take a pod away before its replacement is ready: set maxUnavailable: 0")
	}
	// On the host's network a second pod finds ADDR taken and restarts
	// without end; in a cluster one pod is no service through a restart.
	r := m.Deployment.Spec.Replicas
	if overlay == "dev" && (r == nil || *r != 1) {
		t.Errorf("replicas %v: want 1 on the host's network", derefOr(r))
	}
	if overlay != "dev" && (r == nil || *r < 2) {
		t.Errorf("replicas %v: want at least 2, so that a restart or a drain leaves one serving", derefOr(r))
	}
}

func derefOr[T any](p *T) any {
	if p == nil {
		return "unset"
	}
	return *p
}

// splitAddr splits ADDR (":8080", "127.0.0.1:8080").
func splitAddr(addr string) (string, int32, error) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return "", 0, strconv.ErrSyntax
	}
	port, err := strconv.ParseInt(addr[i+1:], 10, 32)
	return addr[:i], int32(port), err
}

// parseGoMemLimit reads GOMEMLIMIT as the Go runtime does: a number of
// bytes with an optional B, KiB, MiB, GiB or TiB.
func parseGoMemLimit(s string) (int64, error) {
	for i, unit := range []string{"TiB", "GiB", "MiB", "KiB"} {
		if n, ok := strings.CutSuffix(s, unit); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			return v << (10 * (4 - i)), err
		}
	}
	return strconv.ParseInt(strings.TrimSuffix(s, "B"), 10, 64)
}

// TestManifestsReferToEachOther: what the Deployment, the Job, the Service
// and the PodDisruptionBudget name exists: the ConfigMap, the Secret and
// its keys, the pods' labels, a container port, one image for both.
func TestManifestsReferToEachOther(t *testing.T) {
	forEachOverlay(t, checkReferences)
}

// checkReferences checks what an overlay renders; the objects it does not
// render (dev's Secret, Service and budget) are not checked here: the
// recipe's test runs the dev overlay with the Secret it creates.
func checkReferences(t *testing.T, _ string, m *manifests) {
	secretKeys := map[string]string{}
	if m.Secret != nil {
		secretKeys = secretValues(m.Secret)
	}
	checkRefs := func(what string, c *corev1.Container) {
		for _, from := range c.EnvFrom {
			if from.ConfigMapRef != nil && from.ConfigMapRef.Name != m.ConfigMap.Name {
				t.Errorf("%s: envFrom names ConfigMap %q, want %q", what, from.ConfigMapRef.Name, m.ConfigMap.Name)
			}
			if from.SecretRef != nil && from.SecretRef.Name != m.Secret.Name {
				t.Errorf("%s: envFrom names Secret %q, want %q", what, from.SecretRef.Name, m.Secret.Name)
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				continue
			}
			if ref := e.ValueFrom.SecretKeyRef; ref != nil && m.Secret != nil {
				if _, ok := secretKeys[ref.Key]; ref.Name != m.Secret.Name || !ok {
					t.Errorf("%s: %s comes from Secret %q key %q, which %s does not hold", what, e.Name, ref.Name, ref.Key, m.Secret.Name)
				}
			}
			if ref := e.ValueFrom.ConfigMapKeyRef; ref != nil {
				if _, ok := m.ConfigMap.Data[ref.Key]; ref.Name != m.ConfigMap.Name || !ok {
					t.Errorf("%s: %s comes from ConfigMap %q key %q, which %s does not hold", what, e.Name, ref.Name, ref.Key, m.ConfigMap.Name)
				}
			}
		}
	}
	serve := apiContainer(t, "the Deployment", &m.Deployment.Spec.Template.Spec)
	migrate := apiContainer(t, "the Job", &m.Job.Spec.Template.Spec)
	checkRefs("the Deployment", serve)
	checkRefs("the Job", migrate)
	if serve.Image != migrate.Image {
		t.Errorf("the Job runs image %q, the Deployment %q: migrate with the release you serve", migrate.Image, serve.Image)
	}

	// The migration Job: migrate up over DATABASE_DIRECT_URL, run once.
	if !slices.Equal(migrate.Args, []string{"migrate", "up"}) {
		t.Errorf("the Job's args are %q, want [migrate up]", migrate.Args)
	}
	if !setsFromSecret(migrate, "DATABASE_DIRECT_URL") || !setsFromSecret(migrate, "DATABASE_URL") {
		t.Error("the Job does not take DATABASE_DIRECT_URL (what migrate up runs over) and DATABASE_URL (which every database command requires) from the Secret")
	}
	if p := m.Job.Spec.Template.Spec.RestartPolicy; p != corev1.RestartPolicyNever {
		t.Errorf("the Job's restartPolicy is %q, want Never (its backoffLimit retries)", p)
	}
	for _, name := range []string{"DATABASE_URL", "DATABASE_DIRECT_URL", "WEBHOOK_SECRETS"} {
		if !setsFromSecret(serve, name) {
			t.Errorf("the Deployment does not take %s from the Secret", name)
		}
	}

	// The Service and the budget select exactly the Deployment's pods, and
	// the Job's pods are not among them.
	podLabels := m.Deployment.Spec.Template.Labels
	selector := m.Deployment.Spec.Selector.MatchLabels
	if !matches(selector, podLabels) {
		t.Errorf("the Deployment's selector %v does not match its pods' labels %v", selector, podLabels)
	}
	if matches(selector, m.Job.Spec.Template.Labels) {
		t.Errorf("the Deployment's selector %v matches the Job's pods: the Service would send them requests", selector)
	}
	if m.Service == nil {
		return
	}
	if !equalMaps(m.Service.Spec.Selector, selector) {
		t.Errorf("the Service selects %v, the Deployment %v", m.Service.Spec.Selector, selector)
	}
	if m.PDB.Spec.Selector == nil || !equalMaps(m.PDB.Spec.Selector.MatchLabels, selector) {
		t.Errorf("the PodDisruptionBudget does not select the Deployment's pods (%v)", selector)
	}
	if mu := m.PDB.Spec.MaxUnavailable; mu == nil || mu.IntValue() < 1 || int32(mu.IntValue()) >= *m.Deployment.Spec.Replicas {
		t.Errorf("the PodDisruptionBudget's maxUnavailable is %v: want at least 1 (a drain can proceed) and under the replicas (one keeps serving)", derefOr(mu))
	}
	for _, p := range m.Service.Spec.Ports {
		found := false
		for _, cp := range serve.Ports {
			found = found || p.TargetPort.StrVal == cp.Name || p.TargetPort.IntVal == cp.ContainerPort
		}
		if !found {
			t.Errorf("the Service's port %s targets %s, which is no port of the Deployment's container", p.Name, p.TargetPort.String())
		}
	}
}

func setsFromSecret(c *corev1.Container, name string) bool {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Key == name {
			return true
		}
	}
	return false
}

func matches(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return len(selector) > 0
}

func equalMaps(a, b map[string]string) bool {
	return len(a) == len(b) && matches(a, b)
}

// secretValues returns a Secret's values by key, from stringData and data
// alike (the API server merges the first into the second).
func secretValues(s *corev1.Secret) map[string]string {
	v := map[string]string{}
	for k, b := range s.Data {
		v[k] = string(b)
	}
	for k, s := range s.StringData {
		v[k] = s
	}
	return v
}

// TestEssentialSettings: every value docs/deployment.md calls essential
// is set, or marked FILL-IN where only the team knows it; and every
// variable the manifests set is one the api reads (docs/configuration.md,
// which cmd/api's tests keep equal to the code), so a misspelt name cannot
// pass for a setting.
func TestEssentialSettings(t *testing.T) {
	m := loadManifests(t, "production")
	secrets := secretValues(m.Secret)
	cfg := m.ConfigMap.Data

	// DATABASE_URL through PgBouncer: every host, the primary found on
	// each connection, and statements that survive transaction pooling.
	// DATABASE_DIRECT_URL: every node, no pooler.
	for name, params := range map[string][]string{
		"DATABASE_URL":        {"target_session_attrs=read-write", "default_query_exec_mode=exec"},
		"DATABASE_DIRECT_URL": {"target_session_attrs=read-write"},
	} {
		u, err := url.Parse(secrets[name])
		if err != nil {
			t.Errorf("the Secret's %s: %v", name, err)
			continue
		}
		if hosts := strings.Split(u.Host, ","); len(hosts) < 2 {
			t.Errorf("the Secret's %s names one host (%s): list every node, so that a promoted standby is found without a restart", name, u.Host)
		}
		for _, p := range params {
			k, v, _ := strings.Cut(p, "=")
			if u.Query().Get(k) != v {
				t.Errorf("the Secret's %s lacks %s", name, p)
			}
		}
	}
	if secrets["DATABASE_URL"] == secrets["DATABASE_DIRECT_URL"] {
		t.Error("DATABASE_DIRECT_URL equals DATABASE_URL: the direct URL bypasses the pooler")
	}
	if _, ok := secrets["WEBHOOK_SECRETS"]; !ok {
		t.Error("the Secret has no WEBHOOK_SECRETS: every webhook would be rejected")
	}
	if cfg["EVENTS_REPLICAS"] != "3" {
		t.Errorf("EVENTS_REPLICAS is %q, want 3 (a cluster of three keeps every acknowledged event through one server's loss)", cfg["EVENTS_REPLICAS"])
	}
	if n := len(strings.Split(cfg["NATS_URL"], ",")); n < 3 {
		t.Errorf("NATS_URL lists %d servers, want the cluster's three", n)
	}
	if _, ok := cfg["TRUSTED_PROXIES"]; !ok {
		t.Error("the ConfigMap does not set TRUSTED_PROXIES: behind the cluster's ingress every client would be the proxy")
	}
	for _, name := range []string{"DATABASE_URL", "DATABASE_DIRECT_URL", "WEBHOOK_SECRETS"} {
		if _, ok := cfg[name]; ok {
			t.Errorf("the ConfigMap sets %s: it belongs in the Secret", name)
		}
	}

	documented := documentedVariables(t)
	runtimeVars := map[string]bool{"GOMEMLIMIT": true, "GOMAXPROCS": true, "GOGC": true}
	check := func(where, name string) {
		if !documented[name] && !runtimeVars[name] {
			t.Errorf("%s sets %s, which the api does not read (docs/configuration.md has no row for it)", where, name)
		}
	}
	for name := range cfg {
		check("the ConfigMap", name)
	}
	for name := range secrets {
		check("the Secret", name)
	}
	for _, spec := range []corev1.PodSpec{m.Deployment.Spec.Template.Spec, m.Job.Spec.Template.Spec} {
		for _, c := range spec.Containers {
			for _, e := range c.Env {
				check("container "+c.Name, e.Name)
			}
		}
	}
}

// documentedVariables reads the variables of docs/configuration.md's
// table.
func documentedVariables(t *testing.T) map[string]bool {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([A-Z][A-Z0-9_]*)` \\|").FindAllSubmatch(doc, -1) {
		vars[string(m[1])] = true
	}
	if len(vars) < 20 {
		t.Fatalf("found %d variables in docs/configuration.md: is the table format changed?", len(vars))
	}
	return vars
}

// TestPlaceholdersAreMarked: what only the team can know is marked
// FILL-IN, in comments that say what goes there, and nowhere else is:
// the image, the hosts and passwords of the URLs, the NATS servers, the
// processor, the proxies, the webhook secrets.
func TestPlaceholdersAreMarked(t *testing.T) {
	m := loadManifests(t, "production")
	want := map[string]bool{
		"ConfigMap NATS_URL": true, "ConfigMap PROCESSOR_URL": true, "ConfigMap TRUSTED_PROXIES": true,
		"Secret DATABASE_URL": true, "Secret DATABASE_DIRECT_URL": true, "Secret WEBHOOK_SECRETS": true,
		"Deployment image": true, "Job image": true,
	}
	got := map[string]bool{}
	for k, v := range m.ConfigMap.Data {
		if strings.Contains(v, placeholder) {
			got["ConfigMap "+k] = true
		}
	}
	for k, v := range secretValues(m.Secret) {
		if strings.Contains(v, placeholder) {
			got["Secret "+k] = true
		}
	}
	if strings.Contains(m.Deployment.Spec.Template.Spec.Containers[0].Image, placeholder) {
		got["Deployment image"] = true
	}
	if strings.Contains(m.Job.Spec.Template.Spec.Containers[0].Image, placeholder) {
		got["Job image"] = true
	}
	for k := range want {
		if !got[k] {
			t.Errorf("%s holds no %s placeholder: a team must fill it in", k, placeholder)
		}
	}
	for k := range got {
		if !want[k] {
			t.Errorf("%s holds a %s placeholder this test does not expect: add it to want", k, placeholder)
		}
	}
	// Each placeholder is explained in a comment of its file.
	base, _ := filepath.Glob(filepath.Join(manifestDir, "*", "*"))
	overlays, _ := filepath.Glob(filepath.Join(manifestDir, "*", "*", "*"))
	files := append(base, overlays...)
	for _, file := range files {
		data, _ := os.ReadFile(file)
		var comments, values int
		for line := range bytes.Lines(data) {
			if bytes.Contains(line, []byte(placeholder)) {
				if bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
					comments++
				} else {
					values++
				}
			}
		}
		if values > 0 && comments == 0 {
			t.Errorf("%s has %d %s values and no comment saying what to fill in", file, values, placeholder)
		}
	}
}

// G6: the admin listener (ADMIN_ADDR) is a container port of its own that
// the pod annotations tell Prometheus to scrape, and that the Service
// does not publish.
func TestAdminPortIsScrapedNotPublished(t *testing.T) {
	m := loadManifests(t, "production")
	c := apiContainer(t, "the Deployment", &m.Deployment.Spec.Template.Spec)
	_, adminPort, err := splitAddr(m.ConfigMap.Data["ADMIN_ADDR"])
	if err != nil {
		t.Fatalf("the ConfigMap's ADMIN_ADDR %q: %v: set it, or Prometheus has nothing to scrape", m.ConfigMap.Data["ADMIN_ADDR"], err)
	}
	_, addrPort, _ := splitAddr(m.ConfigMap.Data["ADDR"])
	if adminPort == addrPort {
		t.Errorf("ADMIN_ADDR and ADDR share port %d", adminPort)
	}
	var named string
	for _, p := range c.Ports {
		if p.ContainerPort == adminPort {
			named = p.Name
		}
	}
	if named == "" {
		t.Errorf("no container port %d (ADMIN_ADDR) on the Deployment's container", adminPort)
	}
	ann := m.Deployment.Spec.Template.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != strconv.Itoa(int(adminPort)) || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("pod annotations %v: want prometheus.io/scrape true, port %d (ADMIN_ADDR), path /metrics", ann, adminPort)
	}
	for _, sp := range m.Service.Spec.Ports {
		if sp.TargetPort.String() == named || sp.TargetPort.IntValue() == int(adminPort) {
			t.Errorf("the Service publishes the admin port (%s): /metrics and pprof would reach every client of the Service", sp.Name)
		}
	}
}

// TestProductionIsRefusedUntilSet: the production overlay renders nothing
// until the team has written settings.env and secrets.env, and make
// manifests refuses it while a FILL-IN is left in them or in the image;
// filled in, it renders. The dev overlay has nothing to fill in.
func TestProductionIsRefusedUntilSet(t *testing.T) {
	_, err := kustomize(t, filepath.Join(manifestDir, "overlays", "production"))
	if err == nil || !strings.Contains(err.Error(), "settings.env") && !strings.Contains(err.Error(), "secrets.env") {
		t.Errorf("kustomize build of the production overlay without settings.env and secrets.env: %v; want it refused, naming the missing file", err)
	} else {
		t.Logf("without the env files, kustomize build refuses: %s", regexp.MustCompile(`(?m)^Error: .*$`).FindString(err.Error()))
	}

	manifests := func(overlay string) (string, error) {
		cmd := exec.Command("make", "-C", "..", "--no-print-directory", "-s", "manifests", "OVERLAY="+overlay)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if err != nil {
			err = fmt.Errorf("%w: %s", err, stderr.String())
		}
		return stdout.String(), err
	}
	dir := overlayCopy(t, "production")
	out, err := manifests(dir)
	if err == nil || !strings.Contains(err.Error(), "still says FILL-IN") {
		t.Fatalf("make manifests of the production overlay as the examples leave it: %v; want it refused for its FILL-IN values\n%.500s", err, out)
	}
	for _, want := range []string{"settings.env:", "NATS_URL=", "PROCESSOR_URL=", "TRUSTED_PROXIES=", "secrets.env:", "DATABASE_URL=", "DATABASE_DIRECT_URL=", "WEBHOOK_SECRETS=", "image: registry.example.com/payments-api:FILL-IN"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("make manifests refused without naming %q:\n%v", want, err)
		}
	}
	t.Logf("with the examples as they are, make manifests refuses: %s", strings.SplitN(err.Error(), "\n", 2)[0])

	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, bytes.ReplaceAll(b, []byte(placeholder), []byte("set")), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, err = manifests(dir)
	if err != nil {
		t.Fatalf("make manifests of the production overlay filled in: %v", err)
	}
	if _, err := decodeManifests([]byte(out), overlayKinds["production"]); err != nil {
		t.Errorf("make manifests of the production overlay filled in: %v", err)
	}
	if out, err := manifests("dev"); err != nil || !strings.Contains(out, "kind: Deployment") {
		t.Errorf("make manifests OVERLAY=dev: %v\n%.300s", err, out)
	}
}
