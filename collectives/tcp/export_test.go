package tcp

// SetDialFailedHook makes a Transport built from c call f after each dial
// to a peer that fails (the peer is not listening yet), before it retries.
// f may be called from several goroutines at once.
func SetDialFailedHook(c *Config, f func(addr string, err error)) { c.dialFailed = f }
