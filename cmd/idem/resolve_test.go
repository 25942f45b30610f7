package main

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/sqltest"
	"github.com/idemgo/idem/internal/testing/testenv"
	"github.com/idemgo/idem/sqlstore"
)

// quarantineLease is the lease of the stores that quarantine keys here:
// short, as each quarantine waits for two of them to run out.
const quarantineLease = idem.MinLeaseTTL

// quarantineKey crashes key's attempts on s (MaxTakeOvers 1) until s
// quarantines it: the first attempt lapses, the take-over records cp and
// lapses too. It returns the take-over's lease, the quarantined key's last
// attempt, and the first's, the attempt it took over.
func quarantineKey(t *testing.T, s idem.Store, key string, cp []byte) (last, prior *idem.Lease) {
	t.Helper()
	ctx := context.Background()
	for i := range 2 {
		c, err := s.Claim(ctx, key, nil)
		if err != nil || c.Outcome != idem.Claimed {
			t.Fatalf("Claim(%q) = %v, %v; want Claimed", key, c.Outcome, err)
		}
		if i == 1 {
			if err := s.(idem.Checkpointer).Checkpoint(ctx, c.Lease, cp); err != nil {
				t.Fatalf("Checkpoint = %v", err)
			}
		}
		prior, last = last, c.Lease
		time.Sleep(quarantineLease + 50*time.Millisecond)
	}
	if _, err := s.Claim(ctx, key, nil); !errors.Is(err, idem.ErrQuarantined) {
		t.Fatalf("Claim(%q) after 2 crashes with MaxTakeOvers 1 = %v; want ErrQuarantined", key, err)
	}
	return last, prior
}

// inspect --quarantined lists the quarantined keys, inspect KEY shows the
// attempts and the checkpoint, and resolve settles a key (--forget: the
// next claim runs it as new; --confirm: a duplicate with the result) and
// refuses one that is not quarantined: on real Redis, Cluster and
// Postgres, and on SQLite.
func TestResolveAndInspectQuarantined(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"sqlite", "redis", "cluster", "postgres"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			o := idem.Options{Worker: "w-9", LeaseTTL: quarantineLease, Retention: time.Minute, MaxTakeOvers: 1}
			var s idem.Store
			var flags []string
			var err error
			switch name {
			case "sqlite":
				var path string
				path, s = sqliteFile(t, o)
				flags = []string{"--sqlite", path}
			case "redis":
				ro := idem.RedisOptionsFrom(o)
				ro.Prefix = testenv.UniquePrefix()
				s, err = idem.NewRedisStore(testenv.Redis(t), ro)
				flags = []string{"--redis", testenv.Lookup(t, testenv.RedisAddrVar), "--prefix", ro.Prefix}
			case "cluster":
				ro := idem.RedisOptionsFrom(o)
				ro.Prefix = testenv.UniquePrefix()
				s, err = idem.NewRedisStore(testenv.Cluster(t), ro)
				flags = []string{"--cluster", testenv.Lookup(t, testenv.ClusterAddrsVar), "--prefix", ro.Prefix}
			case "postgres":
				so := sqlstore.OptionsFrom(o, sqlstore.Postgres)
				so.Table = sqltest.UniqueTable()
				s = sqltest.NewStore(t, sqltest.Postgres(t), so)
				flags = []string{"--postgres", testenv.PostgresDSN(t), "--table", so.Table}
			}
			if err != nil {
				t.Fatal(err)
			}
			last, prior := quarantineKey(t, s, "poison:1", []byte("step-2"))
			quarantineKey(t, s, "poison:2", nil)
			// A live holder, kept alive while the test runs: the short
			// lease would otherwise run out before the checks below.
			live, err := s.Claim(context.Background(), "live", nil)
			if err != nil || live.Outcome != idem.Claimed {
				t.Fatalf("Claim(live) = %v, %v; want Claimed", live.Outcome, err)
			}
			_, stop := idem.KeepAlive(context.Background(), s, live.Lease)
			t.Cleanup(stop)
			cmd := func(args ...string) result {
				t.Helper()
				return runCLI(t, nil, append(append([]string{args[0]}, flags...), args[1:]...)...)
			}

			r := cmd("inspect", "--quarantined")
			if r.code != exitOK || !strings.Contains(r.stdout, "2 quarantined keys") ||
				!strings.Contains(r.stdout, "poison:1  1 take-overs, last attempt w-9 token ") || !strings.Contains(r.stdout, "poison:2") ||
				strings.Contains(r.stdout, "live") {
				t.Errorf("inspect --quarantined = %d:\n%s%s\nwant poison:1 and poison:2 listed, not live", r.code, r.stdout, r.stderr)
			}
			r = cmd("inspect", "--quarantined", "--json")
			var list []inspection
			if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 2 || list[0].Key != "poison:1" ||
				list[0].State != "quarantined" || list[0].Token != last.Token {
				t.Errorf("inspect --quarantined --json = %v\n%s\nwant poison:1 (token %d) and poison:2, quarantined", err, r.stdout, last.Token)
			}

			r = cmd("inspect", "poison:1")
			for _, want := range []string{"state        quarantined\n", "owner        w-9\n", "take-overs   1\n",
				"prior        owner w-9, token " + strconv.FormatInt(prior.Token, 10) + ", claimed ", `checkpoint   "step-2"`,
				"quarantine ends in", "idem resolve poison:1 --forget"} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("inspect poison:1 = %d, lacks %q:\n%s%s", r.code, want, r.stdout, r.stderr)
				}
			}
			r = cmd("inspect", "--json", "poison:1")
			var in inspection
			if err := json.Unmarshal([]byte(r.stdout), &in); err != nil || in.Prior == nil || in.Prior.Token != prior.Token ||
				in.Checkpoint == nil || *in.Checkpoint != "step-2" || in.TakeOvers != 1 {
				t.Errorf("inspect --json poison:1 = %v\n%s\nwant prior token %d, checkpoint step-2, 1 take-over", err, r.stdout, prior.Token)
			}

			if r = cmd("resolve", "--forget", "poison:1"); r.code != exitOK || !strings.Contains(r.stdout, "forgotten") {
				t.Errorf("resolve --forget poison:1 = %d:\n%s%s", r.code, r.stdout, r.stderr)
			}
			if c, err := s.Claim(context.Background(), "poison:1", nil); err != nil || c.Outcome != idem.Claimed || c.TakeOver {
				t.Errorf("Claim(poison:1) after resolve --forget = %v (take-over %v), %v; want Claimed as new", c.Outcome, c.TakeOver, err)
			}
			if r = cmd("resolve", "--confirm", "refunded", "poison:2"); r.code != exitOK || !strings.Contains(r.stdout, "recorded as done") {
				t.Errorf("resolve --confirm poison:2 = %d:\n%s%s", r.code, r.stdout, r.stderr)
			}
			if c, err := s.Claim(context.Background(), "poison:2", nil); err != nil || c.Outcome != idem.Duplicate || string(c.Record.Result) != "refunded" {
				t.Errorf("Claim(poison:2) after resolve --confirm = %v, %v; want Duplicate with \"refunded\"", c.Outcome, err)
			}
			r = cmd("resolve", "--forget", "live")
			if r.code != exitFailed || !strings.Contains(r.stderr, "not quarantined") {
				t.Errorf("resolve --forget live = %d:\n%s%s\nwant 1, not quarantined", r.code, r.stdout, r.stderr)
			}
			if rec, err := s.Lookup(context.Background(), "live"); err != nil || rec.Confirmed {
				t.Errorf("Lookup(live) after a refused resolve = %+v, %v; want its claim left", rec, err)
			}
			if r = cmd("inspect", "--quarantined"); r.code != exitOK || !strings.Contains(r.stdout, "0 quarantined keys") {
				t.Errorf("inspect --quarantined after both resolved = %d:\n%s%s", r.code, r.stdout, r.stderr)
			}
		})
	}
}

// resolve's usage errors come before any store is opened.
func TestResolveUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"resolve", "--sqlite", "x.db", "k"},
		{"resolve", "--sqlite", "x.db", "--forget", "--confirm", "r", "k"},
		{"resolve", "--sqlite", "x.db", "--forget"},
		{"resolve", "--sqlite", "x.db", "--confirm-hex", "zz", "k"},
		{"resolve", "--forget", "k"},
		{"resolve", "--sqlite", "x.db", "--force", "k"},
		{"resolve", "--sqlite", "x.db", "--confirm", "r", "--force", "k"},
		{"resolve", "--sqlite", "x.db", "--do", "not json", "k"},
		{"resolve", "--sqlite", "x.db", "--confirm", "r", "--header", "Location: /a", "k"},
		{"resolve", "--sqlite", "x.db", "--http-status", "201", "k"},
		{"resolve", "--sqlite", "x.db", "--http-status", "201", "--body", "a", "--body-file", "b", "h20:1:k"},
		{"resolve", "--sqlite", "x.db", "--http-status", "503", "h20:1:k"},
		{"resolve", "--sqlite", "x.db", "--do", "{}", "h20:1:k"},
		{"inspect", "--sqlite", "x.db", "--quarantined", "k"},
		{"inspect", "--sqlite", "x.db", "--quarantined", "--limit", "-1"},
	} {
		r := runCLI(t, nil, args...)
		if r.code != exitUsage {
			t.Errorf("idem %q = %d; want %d\n%s", args, r.code, exitUsage, r.stderr)
		}
		r.wantOneLine(t, args)
	}
}
