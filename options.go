package idem

import (
	"cmp"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemgo/idem/internal/badopt"
	"github.com/idemgo/idem/internal/nilcheck"
)

// MaxFingerprintBytes bounds a fingerprint: it is meant to be a hash of the
// request, not the request.
const MaxFingerprintBytes = 1024

// Options are the settings every store shares; each store's own options
// (RedisOptions, the SQL store's) repeat these fields in one flat literal.
// The zero value is valid: every zero field means its documented default.
type Options struct {
	// Retention is how long a confirmed key is remembered. At least
	// LeaseTTL. Default 24h.
	Retention time.Duration
	// LeaseTTL is how long a claim binds unless renewed. At least
	// idem.MinLeaseTTL (500ms), which KeepAlive can renew in time. Default
	// 30s.
	LeaseTTL time.Duration
	// Worker names this store's leases (Lease.Owner); no two stores may
	// share one. At most 255 bytes, no NUL. Default: a random UUID.
	Worker string
	// MaxKeyBytes bounds keys. Default 1024.
	MaxKeyBytes int
	// MaxResultBytes bounds Confirm's result. Default 1 MiB.
	MaxResultBytes int
	// Logger receives what an operator must see (a late confirm, a lost
	// lease, a store failure at most once a second, a damaged record, and
	// on Redis what first contact found unsafe but allowed). Default: none.
	Logger *slog.Logger
	// Observer is called once per operation. Default: none.
	Observer Observer
	// KeyHasher hashes keys for errors, the Logger and the Observer.
	// Default: a random secret per process.
	KeyHasher *KeyHasher
	// RevealKeys makes errors and log lines name keys as they are (quoted)
	// instead of by their hash, for debugging. Keys may carry personal
	// data: leave it off in production. Default false.
	RevealKeys bool
	// MaxTakeOvers is how many take-overs in a row (claims whose lease ran
	// out unconfirmed, each taken over by the next Claim) a key may have;
	// when the last of them lapses too, the next Claim quarantines the key
	// instead of running the work once more. Not negative. Default 3.
	MaxTakeOvers int
}

// MinLeaseTTL is the shortest LeaseTTL a store accepts. KeepAlive renews a
// lease when a third of it has passed, so the renewal's round trip, and any
// retry of it, must land within the other two thirds: below that, a slow
// round trip or a scheduling pause lets the lease run out while its work
// runs, and the next caller does the work again. Measured on a 2-core
// machine under -race, eight callers of one key, three leases of work:
// with 100ms leases the work ran twice in 6 of 120 runs (every backend
// failed once or more) at load 23, and now and then at load 4-8 (3 runs
// in about 20); with 500ms, 0 of 80 at load 23 (issue 43). A pause of a
// third of a second is what such a machine shows; a real network adds
// its own.
const MinLeaseTTL = 500 * time.Millisecond

// Defaults of Options.
const (
	DefaultRetention      = 24 * time.Hour
	DefaultLeaseTTL       = 30 * time.Second
	DefaultMaxKeyBytes    = 1024
	DefaultMaxResultBytes = 1 << 20
)

// errZeroStore is what every operation of a store's zero value answers: its
// options were never resolved, so no check or default can be trusted.
var errZeroStore = errors.New("idem: a zero-value store: make it with its constructor " +
	"(NewRedisStore, NewMemoryStore, sqlstore.New; a store of one's own, its Core with NewCore)")

// withDefaults validates o and fills in its defaults. Each error names the
// one field at fault.
func (o Options) withDefaults() (Options, error) {
	if o.Retention < 0 {
		return o, badopt.Default("idem", "Retention", o.Retention, DefaultRetention, "is negative")
	}
	if o.LeaseTTL < 0 {
		return o, badopt.Default("idem", "LeaseTTL", o.LeaseTTL, DefaultLeaseTTL, "is negative")
	}
	if o.MaxKeyBytes < 0 {
		return o, badopt.Default("idem", "MaxKeyBytes", o.MaxKeyBytes, DefaultMaxKeyBytes, "is negative")
	}
	if o.MaxResultBytes < 0 {
		return o, badopt.Default("idem", "MaxResultBytes", o.MaxResultBytes, DefaultMaxResultBytes, "is negative")
	}
	if o.MaxTakeOvers < 0 {
		return o, badopt.Default("idem", "MaxTakeOvers", o.MaxTakeOvers, DefaultMaxTakeOvers, "is negative")
	}
	// Stores keep time in milliseconds (Redis PX): a sub-millisecond
	// duration would round to nothing and expire at once.
	if o.Retention > 0 && o.Retention < time.Millisecond {
		return o, badopt.Error("idem", "Retention", o.Retention, "is under 1ms")
	}
	if o.LeaseTTL > 0 && o.LeaseTTL < MinLeaseTTL {
		return o, badopt.Error("idem", "LeaseTTL", o.LeaseTTL,
			"is under %v, too short for KeepAlive to renew (at a third of the lease) before it runs out", MinLeaseTTL)
	}
	setRetention, setLease := o.Retention != 0, o.LeaseTTL != 0
	o.Retention = cmp.Or(o.Retention, DefaultRetention)
	o.LeaseTTL = cmp.Or(o.LeaseTTL, DefaultLeaseTTL)
	// A confirmation forgotten before a claim would have expired lets a
	// duplicate in while its original could still be running.
	if o.Retention < o.LeaseTTL {
		if setRetention && setLease {
			return o, badopt.Error("idem", "Retention", o.Retention, "is shorter than LeaseTTL %v", o.LeaseTTL)
		}
		if setRetention {
			return o, badopt.Error("idem", "Retention", o.Retention, "is shorter than the default LeaseTTL %v; set LeaseTTL too", o.LeaseTTL)
		}
		return o, badopt.Error("idem", "LeaseTTL", o.LeaseTTL, "is longer than the default Retention %v; set Retention too", o.Retention)
	}
	if o.Worker == "" {
		o.Worker = uuid.NewString()
	}
	if len(o.Worker) > 255 {
		return o, badopt.Error("idem", "Worker", o.Worker[:32]+"...", "is %d bytes; at most 255", len(o.Worker))
	}
	if strings.ContainsRune(o.Worker, 0) {
		return o, badopt.Error("idem", "Worker", o.Worker, "contains a NUL byte")
	}
	// A typed nil would pass every check here and panic on the first
	// operation, far from the mistake.
	if o.Observer != nil && nilcheck.Nil(o.Observer) {
		return o, badopt.Error("idem", "Observer", o.Observer, "is nil and would panic on the first operation; leave Observer nil for none")
	}
	o.MaxKeyBytes = cmp.Or(o.MaxKeyBytes, DefaultMaxKeyBytes)
	o.MaxResultBytes = cmp.Or(o.MaxResultBytes, DefaultMaxResultBytes)
	o.MaxTakeOvers = cmp.Or(o.MaxTakeOvers, DefaultMaxTakeOvers)
	return o, nil
}
