package storetest

import (
	"sync"
	"time"

	"github.com/idemgo/idem"
)

// MemoryBackend returns a Backend over one new idem.MemoryStore, whose
// clock the suite moves (Advance) instead of waiting: every store Open
// returns shares its records (MemoryStore.Share), as the contract asks.
// It is the reference a Store of your own can be run beside:
//
//	storetest.Run(t, func(*testing.T) storetest.Backend { return storetest.MemoryBackend() })
func MemoryBackend() Backend {
	c := &clock{now: time.Now()}
	var (
		once sync.Once
		m    *idem.MemoryStore
		err  error
	)
	return Backend{
		Open: func(o idem.Options) (idem.Store, error) {
			once.Do(func() { m, err = idem.NewMemoryStoreClock(idem.Options{}, c.Now) })
			if err != nil {
				return nil, err
			}
			return m.Share(o)
		},
		Advance: c.Advance,
		Now:     c.Now,
	}
}

// clock is a clock that moves only when told to.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

// Now returns the clock's time.
func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
