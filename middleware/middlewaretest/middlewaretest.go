// Package middlewaretest is the scenario suite of the idempotency
// middleware, for every way of mounting it: the net/http middleware runs
// it on a plain handler, and each framework adapter (the Echo and Gin
// modules) on its framework, so that a service answers alike whichever
// front door it is written on.
//
// A Mount builds the service under test from the middleware's Options and
// a plain handler; Run sends request sequences through it and checks each
// answer: the first request runs and is recorded, a retry replays it, a
// key reused for another request is 422, a key in flight is 409 with
// Retry-After, the store down is 503, the keep rules decide what is
// recorded, a panic releases the key, the handler finds the lease in its
// request's context (and, after a crash, the take-over), a key whose
// requests crashed the server repeatedly is 423, and every error is the
// problem+json a client acts on (the public idempot.dev scenarios among
// them).
//
//	func TestScenarios(t *testing.T) {
//		middlewaretest.Run(t, func(o middleware.Options, h http.Handler) (http.Handler, error) {
//			mw, err := middleware.New(o)
//			if err != nil {
//				return nil, err
//			}
//			return mw(h), nil
//		})
//	}
package middlewaretest

import (
	"net/http"
	"testing"

	"github.com/idemgo/idem/middleware"
)

// Mount builds the service under test: h, reached through the middleware
// that o describes, mounted as the framework mounts it. h serves every
// path the suite sends to (POST, PATCH and PUT under /orders): the
// service must route them all to it. An error (the middleware's New
// refusing o) fails the scenario.
type Mount func(o middleware.Options, h http.Handler) (http.Handler, error)

// Request headers the suite's handler acts on.
const (
	headerStatus = "X-Test-Status" // answer with this status
	headerHold   = "X-Test-Hold"   // block until the scenario releases it
	headerPanic  = "X-Test-Panic"  // panic
	headerDie    = "X-Test-Die"    // the server dies: its store answers nothing from then on
)

// Run runs every scenario on services that mount builds, each scenario a
// subtest with a store of its own.
func Run(t *testing.T, mount Mount) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) { sc.run(t, mount) })
	}
}

var scenarios = []struct {
	name string
	run  func(t *testing.T, mount Mount)
}{
	{"FirstThenReplay", firstThenReplay},
	{"PassThrough", passThrough},
	{"Mismatch", mismatch},
	{"InFlight", inFlight},
	{"StoreDown", storeDown},
	{"KeepRules", keepRules},
	{"Panic", panicReleases},
	{"Lease", leaseInContext},
	{"Crash", crashTakeOverQuarantine},
	{"Problems", problems},
}
