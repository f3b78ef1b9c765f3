package bench

import "errors"

// ErrMemory is returned by Config.CheckMemory for a run whose buffers would
// not fit in the memory available.
var ErrMemory = errors.New("bench: not enough memory")
