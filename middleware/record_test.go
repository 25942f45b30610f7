package middleware

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/httprecord"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
)

// A response over MaxResponseBytes is sent whole, recorded as done without
// its body, and replayed with HeaderBodyOmitted; the handler runs once.
func TestLargeResponse(t *testing.T) {
	eachStore(t, func(t *testing.T, s *countingStore) {
		runs := 0
		big := strings.Repeat("x", 1000)
		h := mustNew(t, Options{SingleTenant: true, Store: s, MaxResponseBytes: 100}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs++
			w.Header().Set("Location", "/reports/1")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(big))
		}))
		first := do(h, req{key: "k", body: "{}"})
		if first.Code != 201 || first.Body.String() != big || first.Header().Get(HeaderBodyOmitted) != "" {
			t.Errorf("first = %d, %d bytes, %v; want 201 and the whole body", first.Code, first.Body.Len(), first.Header())
		}
		w := do(h, req{key: "k", body: "{}"})
		hd := w.Header()
		if w.Code != 201 || w.Body.Len() != 0 || hd.Get(HeaderBodyOmitted) != "true" || hd.Get(HeaderReplayed) != "true" ||
			hd.Get("Location") != "/reports/1" || !strings.HasPrefix(hd.Get("Content-Type"), "text/plain") {
			t.Errorf("replay = %d, %d bytes, %v; want 201, no body, body-omitted, Location and the sniffed Content-Type", w.Code, w.Body.Len(), hd)
		}
		if runs != 1 {
			t.Errorf("handler ran %d times; want 1", runs)
		}
	})
}

// A result the store finds too large is recorded again without its body:
// the work is done, whatever the size of its answer.
func TestResultTooLargeForStore(t *testing.T) {
	s := &countingStore{Store: memStore(idem.Options{MaxResultBytes: 200})}
	runs := 0
	h := mustNew(t, Options{SingleTenant: true, Store: s}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		_, _ = w.Write(bytes.Repeat([]byte("y"), 500))
	}))
	if w := do(h, req{key: "k", body: "{}"}); w.Code != 200 || w.Body.Len() != 500 {
		t.Fatalf("first = %d with %d bytes; want 200 with 500", w.Code, w.Body.Len())
	}
	w := do(h, req{key: "k", body: "{}"})
	if w.Code != 200 || w.Header().Get(HeaderBodyOmitted) != "true" || runs != 1 {
		t.Errorf("replay = %d %v after %d runs; want a 200 replay without body, 1 run", w.Code, w.Header(), runs)
	}
}

// A recorded response that does not decode is a 500 problem, never a panic
// and never a second run.
func TestDamagedRecord(t *testing.T) {
	mem := memStore(idem.Options{})
	s := &countingStore{Store: mem}
	var c counter
	h := mustNew(t, Options{SingleTenant: true, Store: s}, &c)
	do(h, req{key: "k", body: "{}"})
	key := s.claimedKeys()[0]
	rec, err := mem.Lookup(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	// Record garbage under the same key and fingerprint.
	mem2 := memStore(idem.Options{})
	cl, _ := mem2.Claim(context.Background(), key, rec.Fingerprint)
	_ = mem2.Confirm(context.Background(), cl.Lease, []byte{1, 0, 0})
	h2 := mustNew(t, Options{SingleTenant: true, Store: mem2}, &c)
	wantProblem(t, do(h2, req{key: "k", body: "{}"}), 500, TypeRecordDamaged)
	if c.runs.Load() != 1 {
		t.Errorf("handler ran %d times; want 1", c.runs.Load())
	}
}

// #17, deliver 2: a store that stops answering after the handler ran does
// not hold the response past the lease's end (RecordTimeout alone held it
// 10.2 s): the client gets the handler's response, and a retry after the
// lease runs the handler again. A handler that outlives its first TTL has
// its lease renewed, and the bound follows the renewals.
func TestRecordStopsAtLeaseEnd(t *testing.T) {
	const ttl = idem.MinLeaseTTL
	stores := map[string]func(t *testing.T) idem.Store{
		"memory": func(t *testing.T) idem.Store { return memStore(idem.Options{LeaseTTL: ttl}) },
		"redis": func(t *testing.T) idem.Store {
			st, err := idem.NewRedisStore(testenv.Redis(t), idem.RedisOptions{LeaseTTL: ttl, Prefix: uniqueName("idem-mw-") + ":"})
			if err != nil {
				t.Fatalf("NewRedisStore = %v", err)
			}
			return st
		},
	}
	for name, open := range stores {
		for _, work := range []time.Duration{0, 2 * ttl} {
			t.Run(fmt.Sprintf("%s/handler %v", name, work), func(t *testing.T) {
				s := &countingStore{Store: open(t)}
				s.confirmErr.Store(1 << 20) // the store is down once the work is done
				var c counter
				h := mustNew(t, Options{SingleTenant: true, Store: s, RecordTimeout: 10 * time.Second}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					time.Sleep(work)
					c.ServeHTTP(w, r)
				}))
				start := time.Now()
				w := do(h, req{key: "k", body: "{}"})
				took := time.Since(start)
				if w.Code != 201 || w.Header().Get(HeaderReplayed) != "" {
					t.Errorf("first = %d %v; want the handler's 201", w.Code, w.Header())
				}
				// The lease ends at most a TTL after the last renewal,
				// which is at most the handler's end.
				if limit := work + ttl + 250*time.Millisecond; took > limit {
					t.Errorf("response after %v; want it by the lease's end, within %v", took, limit)
				}
				time.Sleep(ttl) // the lease has run out
				s.confirmErr.Store(0)
				if w := do(h, req{key: "k", body: "{}"}); w.Code != 201 || c.runs.Load() != 2 {
					t.Errorf("retry after the lease = %d after %d runs; want 201 after 2 (the work was not recorded)", w.Code, c.runs.Load())
				}
			})
		}
	}
}

// #17, deliver 4: with RequestIDHeader the request id of the request that
// did the work is recorded, and a replay answers Original-Request with it,
// not with the retry's own id; in both modes. A request without one, or
// with one over 255 bytes, records none.
func TestOriginalRequest(t *testing.T) {
	modes := map[string]func(t *testing.T) Options{
		"lease": func(t *testing.T) Options { return Options{SingleTenant: true, Store: newCounting()} },
		"tx":    func(t *testing.T) Options { return Options{SingleTenant: true, Tx: newTxEnv(t, sqlstore.SQLite).store} },
	}
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			o := mode(t)
			o.RequestIDHeader = "x-request-id"
			var c counter
			h := mustNew(t, o, &c)
			id := func(v string) map[string]string { return map[string]string{"X-Request-Id": v} }
			for _, tc := range []struct {
				key, first, retry, want string
			}{
				{"k1", "req-1", "req-2", "req-1"},
				{"k2", "", "req-3", ""},
				{"k3", strings.Repeat("r", 256), "req-4", ""},
				{"k4", strings.Repeat("r", 255), "", strings.Repeat("r", 255)},
			} {
				first := do(h, req{key: tc.key, body: "{}", header: id(tc.first)})
				if first.Code != 201 || first.Header().Get(HeaderOriginalRequest) != "" {
					t.Errorf("%s: first = %d %v; want 201 without %s", tc.key, first.Code, first.Header(), HeaderOriginalRequest)
				}
				w := do(h, req{key: tc.key, body: "{}", header: id(tc.retry)})
				if w.Code != 201 || w.Header().Get(HeaderReplayed) != "true" || w.Body.String() != first.Body.String() {
					t.Errorf("%s: retry = %d %v %q; want a replay of %q", tc.key, w.Code, w.Header(), w.Body, first.Body)
				}
				if got, ok := w.Header()[HeaderOriginalRequest]; tc.want == "" && ok || tc.want != "" && (len(got) != 1 || got[0] != tc.want) {
					t.Errorf("%s: replay's %s = %q (present %t); want %q", tc.key, HeaderOriginalRequest, got, ok, tc.want)
				}
			}
			if c.runs.Load() != 4 {
				t.Errorf("handler ran %d times; want 4", c.runs.Load())
			}
		})
	}
}

// The recorded-response format is pinned: a record written before request
// ids were recorded still replays, whole and without Original-Request, and
// a record with one adds only the ":original-request" line, which an older
// decoder skips as a header not in its ReplayHeaders.
func TestRecordFormatCompatible(t *testing.T) {
	// Written by the version before Options.RequestIDHeader: 201, Content-Type
	// and Location, body {"id":7}.
	old := []byte("\x01\x00\x00\xc9\x02" +
		"\x0cContent-Type\x10application/json" +
		"\x08Location\x09/orders/7" +
		"\x08{\"id\":7}")
	withID := []byte("\x01\x00\x00\xc9\x03" +
		"\x11:original-request\x05req-1" +
		"\x0cContent-Type\x10application/json" +
		"\x08Location\x09/orders/7" +
		"\x08{\"id\":7}")
	resp := &httprecord.Response{Status: 201, Body: []byte(`{"id":7}`),
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/7"}}}
	if got := httprecord.Encode(resp); !bytes.Equal(got, old) {
		t.Errorf("Encode without a request id = %q; want the old format %q", got, old)
	}
	resp.RequestID = "req-1"
	if got := httprecord.Encode(resp); !bytes.Equal(got, withID) {
		t.Errorf("Encode with a request id = %q; want %q", got, withID)
	}

	// No ReplayHeaders, of this version or an older one, can list the
	// line: older decoders skip it.
	if validFieldName(httprecord.LineRequestID) {
		t.Errorf("%q is a header field name: an older decoder may replay it", httprecord.LineRequestID)
	}

	for name, tc := range map[string]struct {
		record []byte
		want   string // Original-Request; "" for none
	}{"old record": {old, ""}, "record with an id": {withID, "req-1"}} {
		t.Run(name, func(t *testing.T) {
			var c counter
			q := req{key: "k", body: "{}"}
			r := q.build()
			fp, err := fingerprint(r, func() io.Reader { return strings.NewReader(q.body) })
			if err != nil {
				t.Fatal(err)
			}
			mem := memStore(idem.Options{})
			ctx := context.Background()
			cl, err := mem.Claim(ctx, storeKey("", "k"), fp)
			if err != nil {
				t.Fatal(err)
			}
			if err := mem.Confirm(ctx, cl.Lease, tc.record); err != nil {
				t.Fatal(err)
			}
			h := mustNew(t, Options{SingleTenant: true, Store: mem, RequestIDHeader: "X-Request-Id"}, &c)
			w := do(h, q)
			hd := w.Header()
			if w.Code != 201 || hd.Get(HeaderReplayed) != "true" || hd.Get("Location") != "/orders/7" ||
				hd.Get("Content-Type") != "application/json" || w.Body.String() != `{"id":7}` || c.runs.Load() != 0 {
				t.Errorf("replay = %d %v %q after %d runs; want the recorded 201, headers and body, no run", w.Code, hd, w.Body, c.runs.Load())
			}
			if got, ok := hd[HeaderOriginalRequest]; tc.want == "" && ok || tc.want != "" && hd.Get(HeaderOriginalRequest) != tc.want {
				t.Errorf("replay's %s = %q; want %q", HeaderOriginalRequest, got, tc.want)
			}
			want := 3 // Content-Type, Location, Idempotent-Replayed
			if tc.want != "" {
				want++
			}
			if len(hd) != want {
				t.Errorf("replay headers = %v; want Content-Type, Location, %s and Original-Request when recorded, only", hd, HeaderReplayed)
			}
		})
	}
}

// limitedStore is a countingStore that reports the MaxResultBytes of the
// store it counts, as the stores of this module do.
type limitedStore struct {
	*countingStore
	max int
}

func (s *limitedStore) MaxResultBytes() int { return s.max }

// #25, deliver 4: a response body of MaxResponseBytes is recorded whole,
// with its replayed headers and request id beside it (RecordOverhead);
// replayed headers larger than that take the body's room, and the record
// goes without its body at the first Confirm, not after one the store
// refused.
func TestResponseAtMaxFits(t *testing.T) {
	const max = 64 << 10
	for _, tc := range []struct {
		name    string
		link    int // bytes of the Link header
		omitted bool
	}{
		{"headers within RecordOverhead", RecordOverhead - 1024, false},
		{"headers over RecordOverhead", 2 * RecordOverhead, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &limitedStore{countingStore: &countingStore{Store: memStore(idem.Options{MaxResultBytes: max})}, max: max}
			body := bytes.Repeat([]byte("z"), max-RecordOverhead) // the default MaxResponseBytes here
			link := "<" + strings.Repeat("l", tc.link) + ">"
			runs := 0
			h := mustNew(t, Options{SingleTenant: true, Store: s, RequestIDHeader: "X-Request-Id"}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs++
				w.Header().Set("Location", "/reports/1")
				w.Header().Set("Link", link)
				w.Header().Set("Content-Type", "application/octet-stream")
				_, _ = w.Write(body)
			}))
			id := map[string]string{"X-Request-Id": strings.Repeat("r", 255)}
			if w := do(h, req{key: "k", body: "{}", header: id}); w.Code != 200 || w.Body.Len() != len(body) {
				t.Fatalf("first = %d with %d bytes; want 200 with %d", w.Code, w.Body.Len(), len(body))
			}
			confirms := s.calls.Load() - 1 // the Claim
			w := do(h, req{key: "k", body: "{}"})
			omitted := w.Header().Get(HeaderBodyOmitted) == "true"
			if w.Code != 200 || w.Header().Get(HeaderReplayed) != "true" || runs != 1 || omitted != tc.omitted {
				t.Fatalf("replay = %d %d bytes, body omitted %t, after %d runs; want a replay, body omitted %t, 1 run", w.Code, w.Body.Len(), omitted, runs, tc.omitted)
			}
			if !tc.omitted && !bytes.Equal(w.Body.Bytes(), body) {
				t.Errorf("replay's body = %d bytes; want the %d recorded", w.Body.Len(), len(body))
			}
			if w.Header().Get("Link") != link {
				t.Errorf("replay's Link = %d bytes; want the %d recorded", len(w.Header().Get("Link")), len(link))
			}
			if confirms != 1 {
				t.Errorf("store calls after the claim = %d; want 1 Confirm, none refused", confirms)
			}
		})
	}
}
