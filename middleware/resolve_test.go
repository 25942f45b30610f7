package middleware

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/crashstore"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
)

// Resolution builds what the middleware replays, and refuses what it
// would not: a status Keep does not record, a header it does not replay,
// a value no header may hold, a body over MaxResponseBytes.
func TestResolutionRefusesWhatIsNotReplayed(t *testing.T) {
	h := http.Header{"Content-Type": {"application/json"}, "location": {"/orders/9"}}
	r, err := Resolution(201, h, []byte(`{"id":9}`), Options{})
	if err != nil || !r.Confirm {
		t.Fatalf("Resolution(201, Content-Type and Location) = %+v, %v; want a confirmation", r, err)
	}
	for _, tt := range []struct {
		name   string
		status int
		h      http.Header
		body   string
		o      Options
		want   string
	}{
		{"5xx", 500, nil, "", Options{}, "status 500"},
		{"409", 409, nil, "", Options{}, "status 409"},
		{"1xx", 102, nil, "", Options{}, "status 102"},
		{"not replayed", 200, http.Header{"X-Run": {"1"}}, "", Options{}, `header "X-Run"`},
		{"credentials", 200, http.Header{"Set-Cookie": {"a=b"}}, "", Options{}, `header "Set-Cookie"`},
		{"CRLF", 200, http.Header{"Location": {"/a\r\nSet-Cookie: a=b"}}, "", Options{}, "CR, LF or NUL"},
		{"large", 200, nil, "12345", Options{MaxResponseBytes: 4}, "MaxResponseBytes"},
		{"Keep of its own", 200, nil, "", Options{Keep: func(s int) bool { return s == 201 }}, "status 200"},
	} {
		if r, err := Resolution(tt.status, tt.h, []byte(tt.body), tt.o); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Resolution = %+v, %v; want an error naming %s", tt.name, r, err, tt.want)
		}
	}
	if _, err := Resolution(402, nil, nil, Options{Keep: func(s int) bool { return s == 402 }}); err != nil {
		t.Errorf("Resolution(402) with a Keep that records it = %v; want nil", err)
	}
}

// A key whose requests crashed their servers is quarantined (423); an
// operator settles it with Resolution's response, and the next retry
// gets exactly that response, replayed, without the handler running: on
// memory, real Redis and Postgres.
func TestResolvedKeyReplaysTheOperatorsResponse(t *testing.T) {
	const lease = idem.MinLeaseTTL
	backends := map[string]func(t *testing.T) func(worker string) idem.Store{
		"memory": func(*testing.T) func(string) idem.Store {
			shared := memStore(idem.Options{LeaseTTL: lease, MaxTakeOvers: 1})
			return func(w string) idem.Store {
				return must(shared.Share(idem.Options{Worker: w, LeaseTTL: lease, MaxTakeOvers: 1}))
			}
		},
		"redis": func(t *testing.T) func(string) idem.Store {
			c, prefix := testenv.Redis(t), uniqueName("idem-mw-")+":"
			return func(w string) idem.Store {
				return must(idem.NewRedisStore(c, idem.RedisOptions{Prefix: prefix, Worker: w, LeaseTTL: lease, MaxTakeOvers: 1}))
			}
		},
		"postgres": func(t *testing.T) func(string) idem.Store {
			db, table := sqltest.Postgres(t), sqltest.UniqueTable()
			sqltest.NewStore(t, db, sqlstore.Options{Dialect: sqlstore.Postgres, Table: table})
			return func(w string) idem.Store {
				return must(sqlstore.New(db, sqlstore.Options{Dialect: sqlstore.Postgres, Table: table, Worker: w, LeaseTTL: lease, MaxTakeOvers: 1}))
			}
		},
	}
	for name, open := range backends {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			opener := open(t)
			runs := 0
			var mu sync.Mutex
			server := func(worker string, dies bool) http.Handler {
				st := &crashstore.Store{Store: opener(worker), Unconfirmed: new(sync.Map)}
				return mustNew(t, Options{SingleTenant: true, Store: st, RecordTimeout: lease},
					http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						mu.Lock()
						runs++
						mu.Unlock()
						if dies {
							st.Dead.Store(true)
						}
						w.WriteHeader(http.StatusCreated)
					}))
			}
			q := req{key: "pay-1", body: `{"amount":5}`}
			do(server("a", true), q)
			time.Sleep(2 * lease)
			do(server("b", true), q)
			time.Sleep(2 * lease)
			healthy := server("c", false)
			wantProblem(t, do(healthy, q), 423, TypeQuarantined)

			res, err := Resolution(201, http.Header{"Location": {"/payments/77"}, "Content-Type": {"application/json"}},
				[]byte(`{"id":77}`), Options{})
			if err != nil {
				t.Fatalf("Resolution = %v", err)
			}
			if err := opener("op").(idem.Resolver).Resolve(t.Context(), StoreKey("", "pay-1"), res); err != nil {
				t.Fatalf("Resolve(StoreKey(pay-1)) = %v; want nil", err)
			}
			w := do(healthy, q)
			if w.Code != 201 || w.Body.String() != `{"id":77}` || w.Header().Get("Location") != "/payments/77" ||
				w.Header().Get("Content-Type") != "application/json" || w.Header().Get(HeaderReplayed) != "true" {
				t.Errorf("retry after the operator's Resolve = %d %v %q; want 201, Location /payments/77, JSON, replayed, body {\"id\":77}",
					w.Code, w.Header(), w.Body)
			}
			mu.Lock()
			if runs != 2 {
				t.Errorf("handler ran %d times; want 2, the crashed ones", runs)
			}
			mu.Unlock()
		})
	}
}
