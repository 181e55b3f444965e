package httpapi

// LimitLookupClients sets the bound of the clients cfg's lookup budget
// remembers, so a test can reach it with a few addresses.
func LimitLookupClients(cfg *Config, n int) { cfg.lookupClients = n }
