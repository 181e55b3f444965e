package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/idemref/payments/internal/idem"
)

// config is read from the environment. Every variable has a documented
// default (README, "Configuration") except DATABASE_URL for serve.
type config struct {
	DatabaseURL       string
	Addr              string
	RequestTimeout    time.Duration
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	ShutdownTimeout   time.Duration
	LockTimeout       time.Duration
	IdempotencyTTL    time.Duration
	LogLevel          slog.Level
}

func loadConfig(getenv func(string) string) (config, error) {
	cfg := config{
		DatabaseURL: getenv("DATABASE_URL"),
		Addr:        getenv("ADDR"),
	}
	if cfg.Addr == "" {
		cfg.Addr = ":8080"
	}
	durations := []struct {
		name string
		dst  *time.Duration
		def  time.Duration
	}{
		{"REQUEST_TIMEOUT", &cfg.RequestTimeout, 10 * time.Second},
		{"READ_HEADER_TIMEOUT", &cfg.ReadHeaderTimeout, 5 * time.Second},
		{"READ_TIMEOUT", &cfg.ReadTimeout, 15 * time.Second},
		{"WRITE_TIMEOUT", &cfg.WriteTimeout, 30 * time.Second},
		{"IDLE_TIMEOUT", &cfg.IdleTimeout, 120 * time.Second},
		{"SHUTDOWN_TIMEOUT", &cfg.ShutdownTimeout, 15 * time.Second},
		{"IDEMPOTENCY_LOCK_TIMEOUT", &cfg.LockTimeout, idem.DefaultLockTimeout},
		{"IDEMPOTENCY_TTL", &cfg.IdempotencyTTL, idem.DefaultTTL},
	}
	for _, d := range durations {
		*d.dst = d.def
		if s := getenv(d.name); s != "" {
			v, err := time.ParseDuration(s)
			if err != nil || v <= 0 {
				return config{}, fmt.Errorf("%s=%q: want a positive duration such as 2s or 24h", d.name, s)
			}
			*d.dst = v
		}
	}
	if s := getenv("LOG_LEVEL"); s != "" {
		if err := cfg.LogLevel.UnmarshalText([]byte(s)); err != nil {
			return config{}, fmt.Errorf("LOG_LEVEL=%q: want debug, info, warn or error", s)
		}
	}
	return cfg, nil
}
