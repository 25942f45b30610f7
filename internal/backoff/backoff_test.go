package backoff

import (
	"testing"
	"time"
)

func TestNextDoublesWithinJitter(t *testing.T) {
	b := Backoff{First: 10 * time.Millisecond, Most: 80 * time.Millisecond}
	for i, d := range []time.Duration{10, 20, 40, 80, 80} {
		d *= time.Millisecond
		if got := b.Next(); got < d/2 || got >= d*3/2 {
			t.Errorf("Next() #%d = %v; want within [%v, %v)", i, got, d/2, d*3/2)
		}
	}
}
