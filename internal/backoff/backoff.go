// Package backoff spaces out retries: exponentially, up to a ceiling, with
// jitter so that many processes that failed together do not retry
// together.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Jitter is the spread of a delay: each is its nominal value times a
// factor in [1-Jitter, 1+Jitter).
const Jitter = 0.2

// Delay is the pause before retry number attempt (0 is the first retry):
// base doubled attempt times, at most ceiling, times 1-Jitter+2*Jitter*r
// for r in [0, 1) (a uniform random number: Next draws one).
func Delay(attempt int, base, ceiling time.Duration, r float64) time.Duration {
	d := base
	for range attempt {
		if d >= ceiling/2 {
			d = ceiling
			break
		}
		d *= 2
	}
	d = min(d, ceiling)
	return time.Duration(float64(d) * (1 - Jitter + 2*Jitter*r))
}

// Next is Delay with a random r.
func Next(attempt int, base, ceiling time.Duration) time.Duration {
	return Delay(attempt, base, ceiling, rand.Float64())
}
