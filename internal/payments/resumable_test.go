package payments

import (
	"slices"
	"testing"
)

// The completer takes over the keys of the multi-step endpoints of
// Endpoints, and resumes them with this package's flows: the two must
// be the same endpoints, or a key would be taken over that nothing here can
// finish, or left expired that only the completer would finish.
func TestCompleterResumesThisPackagesEndpoints(t *testing.T) {
	if want := []string{EndpointPay, EndpointRefund}; !slices.Equal(resumable, want) {
		t.Errorf("the completer resumes %q, want %q", resumable, want)
	}
}
