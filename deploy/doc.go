// Package deploy holds what a team deploys the API with: the image recipe
// (Containerfile, which make image builds, and Containerfile.sbom, its
// bill of materials' image) and the Kubernetes manifests (kubernetes/: a
// Kustomize base and the dev and production overlays). It has no code of
// its own. Its tests render each overlay with kustomize, decode every
// object strictly into the Kubernetes API types and check what they
// promise (security context, probes, grace period, the settings
// docs/deployment.md calls essential, the production overlay's refusal
// until it is filled in), and build the image and run it in Podman: api
// migrate up and api serve from podman run, the push of the image and its
// SBOM to an OCI layout, and docs/deployment.md's recipe word for word
// (the dev overlay under podman kube play), each answering an idempotent
// order.
package deploy
