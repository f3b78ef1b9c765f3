package backoff

import (
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	const s = time.Second
	for _, c := range []struct {
		attempt       int
		base, ceiling time.Duration
		r             float64
		want          time.Duration
	}{
		{0, s / 2, 30 * s, 0.5, s / 2},     // the nominal base
		{1, s / 2, 30 * s, 0.5, s},         // doubled
		{3, s / 2, 30 * s, 0.5, 4 * s},     // 0.5, 1, 2, 4
		{6, s / 2, 30 * s, 0.5, 30 * s},    // 32 s, capped
		{1000, s / 2, 30 * s, 0.5, 30 * s}, // no overflow
		{0, s, 30 * s, 0, 800 * time.Millisecond},
		{0, s, 30 * s, 0.99, 1196 * time.Millisecond},
		{2, s, 3 * s, 0, 2400 * time.Millisecond}, // 4 s capped at 3, -20%
	} {
		got := Delay(c.attempt, c.base, c.ceiling, c.r)
		if got.Round(time.Microsecond) != c.want {
			t.Errorf("Delay(%d, %s, %s, %g) = %s, want %s", c.attempt, c.base, c.ceiling, c.r, got, c.want)
		}
	}
}
