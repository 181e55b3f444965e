package idem

import (
	"errors"
	"testing"
	"time"
)

// A key is remembered at least as long as its result is replayed; unset
// fields (the defaults) pass.
func TestConfigCheck(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want error
	}{
		{Config{}, nil},
		{Config{TTL: 24 * time.Hour, KeyRetention: 24 * time.Hour}, nil},
		{Config{TTL: 48 * time.Hour, KeyRetention: 24 * time.Hour}, ErrRetentionShorterThanTTL},
	} {
		if err := c.cfg.Check(); !errors.Is(err, c.want) {
			t.Errorf("%+v.Check() = %v, want %v", c.cfg, err, c.want)
		}
	}
}
