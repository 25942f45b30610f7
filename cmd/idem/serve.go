package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/idem/internal/metrics"
	"github.com/idemgo/idem/internal/backoff"
	"github.com/idemgo/idem/middleware"
)

const serveAbout = `Serves a small example payments API behind the Idempotency-Key middleware
(lease mode), on an embedded Redis by default, or on --redis, --cluster,
--postgres, --mysql or --sqlite (a SQL table is created if missing):

  POST /payments  {"amount": 1000, "currency": "EUR"}  charges, after --delay
  GET  /payments  every charge made, to count them

It prints curl commands that show a replay (a retry is answered from the
record, Idempotent-Replayed: true, no second charge), a 409 (a retry while
the first request is still in flight, after --lock-timeout) and a 422 (the
key reused for another request). Stop it with Ctrl-C.`

func (c *cli) serve(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var sf storeFlags
	sf.register(fs, c.getenv, kindsAll)
	addr := fs.String("addr", "127.0.0.1:8080", "the `address` to listen on")
	delay := fs.Duration("delay", 2*time.Second, "how long a charge takes, so that a retry can find it in flight")
	lockTimeout := fs.Duration("lock-timeout", time.Second, "how long a retry waits for a request in flight before 409")
	pos, done, st := c.parse(fs, args, "[--addr HOST:PORT] [store flags]", serveAbout+"\n\n"+envHelp(kindsAll))
	if done {
		return st
	}
	if len(pos) > 0 {
		return c.noArgs("serve", pos)
	}
	if err := c.chooseStore("serve", fs, &sf); err != nil {
		return c.usageError("serve", err)
	}
	if *delay < 0 || *lockTimeout <= 0 {
		return c.usageError("serve", errors.New("--delay must not be negative, --lock-timeout must be positive"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b, err := sf.open(ctx, true, false)
	if err != nil {
		return c.fail("serve", exitUsage, err)
	}
	defer b.close()
	if b.isSQL() {
		s, err := b.sqlStore(idem.Options{})
		if err == nil {
			err = s.CreateSchema(ctx)
		}
		if err != nil {
			return c.usageError("serve", err)
		}
	}
	reg := &metrics.Registry{}
	s, err := b.store(idem.Options{Observer: reg})
	if err != nil {
		return c.usageError("serve", err)
	}
	h, err := newPaymentsAPI(s, *delay, *lockTimeout, reg)
	if err != nil {
		return c.usageError("serve", err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return c.usageError("serve", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(c.stdout, "payments API on http://%s (store: %s; a charge takes %v)\n\n", ln.Addr(), b.desc, *delay)
	writeCurlHelp(c.stdout, "http://"+ln.Addr().String(), runTag())
	if err := serveUntil(ctx, srv, ln); err != nil {
		return c.fail("serve", exitFailed, err)
	}
	return exitOK
}

// runTag is a short random tag that keeps the printed keys fresh on a store
// that outlives the server.
func runTag() string {
	var b [2]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// writeCurlHelp prints the curl commands of the tour, against base, with
// keys tagged by tag.
func writeCurlHelp(w io.Writer, base, tag string) {
	post := func(key, body string) string {
		return fmt.Sprintf("curl -si %s/payments -H 'Idempotency-Key: %s' -H 'Content-Type: application/json' -d '%s'", base, key, body)
	}
	k1, k2 := "pay-"+tag+"-1", "pay-"+tag+"-2"
	eur, usd := `{"amount":1000,"currency":"EUR"}`, `{"amount":5000,"currency":"USD"}`
	fmt.Fprintf(w, `# 1. Charge once (201 Created):
%[1]s
# 2. Retry it, as a client does after a timeout: the recorded answer is
#    replayed (Idempotent-Replayed: true) and nobody is charged twice:
%[1]s
# 3. Retry while the first request is still in flight: 409 with Retry-After:
%[2]s >/dev/null & sleep 0.3; %[2]s; wait
# 4. Reuse a key for a different payment: 422:
%[3]s
# Count the charges (two: one per key):
curl -s %[4]s/payments

`, post(k1, eur), post(k2, eur), post(k1, usd), base)
}

// payment is one charge of the example API.
type payment struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Status   string `json:"status"`
}

// paymentsAPI is the example API: it charges on every request that reaches
// it, so any double charge is the middleware's failure to be seen.
type paymentsAPI struct {
	delay time.Duration
	mu    sync.Mutex
	made  []payment
}

// newPaymentsAPI returns the example API behind the middleware on store,
// and, with reg, GET /metrics: reg's counts in Prometheus text format.
func newPaymentsAPI(store idem.Store, delay, lockTimeout time.Duration, reg *metrics.Registry) (http.Handler, error) {
	api := &paymentsAPI{delay: delay}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", api.create)
	mux.HandleFunc("GET /payments", api.list)
	// The example API has no accounts: one tenant.
	mo := middleware.Options{Store: store, SingleTenant: true, LockTimeout: lockTimeout}
	if reg != nil {
		mo.Observer = reg
		mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			_ = reg.WritePrometheus(w)
		})
	}
	idempotent, err := middleware.New(mo)
	if err != nil {
		return nil, err
	}
	return idempotent(mux), nil
}

func (a *paymentsAPI) create(w http.ResponseWriter, r *http.Request) {
	var p payment
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&p); err != nil || p.Amount <= 0 || len(p.Currency) != 3 {
		// A 4xx is recorded too: the same bad request gets the same answer.
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": `want {"amount": positive integer, "currency": "EUR"}`})
		return
	}
	// The slow payment processor. A request cancelled here charged nothing:
	// answer 5xx, which the middleware does not record, so that the key is
	// released and the client's retry charges. (A 200 without a body would
	// be recorded and replayed as if the charge had happened.)
	if !backoff.Sleep(r.Context(), a.delay) {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "cancelled before charging"})
		return
	}
	a.mu.Lock()
	p.ID, p.Status = fmt.Sprintf("pay_%d", len(a.made)+1), "succeeded"
	a.made = append(a.made, p)
	a.mu.Unlock()
	w.Header().Set("Location", "/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, p)
}

func (a *paymentsAPI) list(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	made := append([]payment{}, a.made...)
	a.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"charges": len(made), "payments": made})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// serveUntil serves srv on ln until ctx ends (then shuts it down, giving
// requests in flight 5s) or the server fails; a shutdown is not an error.
func serveUntil(ctx context.Context, srv *http.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = srv.Shutdown(sctx)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
