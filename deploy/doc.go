// Package deploy holds what a team deploys the API with: the image recipe
// (Containerfile, which make image builds) and the Kubernetes manifests
// (kubernetes/). It has no code of its own. Its tests decode every
// manifest strictly into the Kubernetes API types and check what they
// promise (security context, probes, grace period, the settings
// docs/deployment.md calls essential), and build the image and run it in
// Podman: api migrate up and api serve from podman run, then the migration
// Job's pod and the Deployment from podman kube play, each answering an
// idempotent order.
package deploy
