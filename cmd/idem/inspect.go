package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/httprecord"
)

const inspectAbout = `Shows the live record of one key: its state (claimed: a lease is held;
confirmed: the work is done; quarantined: its work crashed its worker more
times in a row than the store's MaxTakeOvers, and waits for idem resolve),
the owner of a live claim (of a quarantined key: its last attempt), the
fencing token, when the lease, the retention or the quarantine ends, the
fingerprint (hex) and the size of the stored result; after a crash, the
attempts: the take-overs in a row, the attempt taken over last (its owner,
token and when it was claimed), the last checkpoint, and how the claim's
own attempt ended: given up by its holder with the reason it gave (idem.Do
after a failed Reconcile), or its lease ran out (a crash or a stall). A
claim whose lease ran out unconfirmed is shown before anyone takes it
over: state lapsed, its owner, token, when it was claimed, its
checkpoint, how it ended, and when the store forgets it. A key without a record (never
claimed, forgotten, or expired) exits 1; so does a damaged record, which
idem resolve KEY --forget --force clears. KEY is the store key as given to Claim; the middleware's
keys look like h2<len>:<scope><len>:<client key>, e.g. 'h20:5:pay-1'
(earlier versions': h1<len>:<scope><len>:<method><len>:<route><len>:<client
key>). --hex reads KEY as hex, for keys
that are not text. Expiry is the store's answer converted to this machine's
clock: an estimate.

--quarantined lists the quarantined keys instead (KEY not given), at most
--limit of them: a SCAN of every master on Redis, a query on SQL.

--http 'METHOD ROUTE' finds the middleware's record from what the client
sent: KEY is then the client's Idempotency-Key (its content: abc for "abc"),
and --scope the tenant that Options.Scope returned; the record's key holds
only these two. METHOD ROUTE finds the records of earlier versions, whose
key held the route as the middleware named it (a ServeMux pattern such as
'POST /payments', a chi pattern, or the path): both 'POST /payments' and
'/payments' are tried as the route. --result prints the recorded response: status, replayed headers,
the request id of the request that did the work, and body.`

func (c *cli) inspect(args []string) int {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	var sf storeFlags
	sf.register(fs, c.getenv, kindsAll)
	asJSON := fs.Bool("json", false, "print one JSON object instead of text")
	asHex := fs.Bool("hex", false, "KEY is hex-encoded")
	httpRoute := fs.String("http", "", "KEY is an HTTP client's key for `'METHOD ROUTE'`, e.g. 'POST /payments'")
	scope := fs.String("scope", "", "with --http, the `TENANT` the middleware's Scope named")
	showResult := fs.Bool("result", false, "print the recorded HTTP response: status, headers and body")
	quarantined := fs.Bool("quarantined", false, "list the quarantined keys instead of one key's record")
	limit := fs.Int("limit", 100, "with --quarantined, list at most `N` keys (0: all)")
	pos, done, st := c.parse(fs, args, "[store flags] [--json] [--http 'METHOD ROUTE' [--scope TENANT]] [--result] KEY | --quarantined [--limit N]", inspectAbout+"\n\n"+envHelp(kindsAll))
	if done {
		return st
	}
	if *quarantined {
		if len(pos) > 0 || *httpRoute != "" || *showResult || *asHex || *scope != "" {
			return c.usageError("inspect", errors.New("--quarantined lists keys: it takes no KEY, --http, --scope, --hex or --result"))
		}
		if *limit < 0 {
			return c.usageError("inspect", fmt.Errorf("--limit %d is negative; give 0 for all", *limit))
		}
		if err := c.chooseStore("inspect", fs, &sf); err != nil {
			return c.usageError("inspect", err)
		}
		return c.listQuarantined(&sf, *limit, *asJSON)
	}
	if len(pos) != 1 {
		return c.usageError("inspect", fmt.Errorf("want exactly one KEY, got %d arguments", len(pos)))
	}
	if err := c.chooseStore("inspect", fs, &sf); err != nil {
		return c.usageError("inspect", err)
	}
	key := pos[0]
	if *asHex {
		k, err := hex.DecodeString(key)
		if err != nil {
			return c.usageError("inspect", fmt.Errorf("--hex: %w", err))
		}
		key = string(k)
	}
	keys := []string{key}
	if *httpRoute != "" {
		var err error
		if keys, err = httpKeys(*httpRoute, *scope, key); err != nil {
			return c.usageError("inspect", err)
		}
	} else if *scope != "" {
		return c.usageError("inspect", errors.New("--scope: only with --http"))
	}
	ctx := context.Background()
	b, err := sf.open(ctx, false, true)
	if err != nil {
		return c.fail("inspect", exitUsage, err)
	}
	defer b.close()
	b.allowEviction = true
	s, err := b.store(idem.Options{})
	if err != nil {
		return c.usageError("inspect", err)
	}
	r, err := lookupAny(ctx, s, keys)
	if errors.Is(err, idem.ErrNotFound) {
		quoted := make([]string, len(keys))
		for i, k := range keys {
			quoted[i] = quoteKey(k)
		}
		err := fmt.Errorf("key %s has no live record in %s (never claimed, forgotten, or expired)%s",
			strings.Join(quoted, " or "), b.desc, notFoundHint(*httpRoute, *scope, key))
		if *asJSON {
			// A script reading --json gets JSON for this answer too.
			_ = c.printJSON(inspection{Key: key, State: "none", Error: oneLine(err.Error())})
		}
		return c.fail("inspect", exitFailed, err)
	}
	if errors.Is(err, idem.ErrDamaged) {
		err := fmt.Errorf("key %s has a damaged record in %s: no front door can read it (%v); clear it with idem resolve %s --forget --force (the work then runs again)",
			quoteKey(keys[0]), b.desc, err, quoteKey(keys[0]))
		if *asJSON {
			_ = c.printJSON(inspection{Key: keys[0], State: "damaged", Error: oneLine(err.Error())})
		}
		return c.fail("inspect", exitFailed, err)
	}
	if err != nil {
		return c.fail("inspect", exitFailed, err)
	}
	in := newInspection(r)
	if r.Confirmed {
		in.Form = string(recordForm(r.Key, r))
	}
	if err := replayable(r.Key, r); err != nil {
		in.Unreadable = err.Error()
	}
	if *showResult {
		if !r.Confirmed {
			return c.fail("inspect", exitFailed, fmt.Errorf("key %s has no result yet: its request is in flight (claimed by %s)", quoteKey(r.Key), or(r.Owner, "-")))
		}
		resp, err := httprecord.Decode(r.Result)
		if err != nil {
			return c.fail("inspect", exitFailed, fmt.Errorf("key %s: the result (%d bytes) is not a response the middleware recorded", quoteKey(r.Key), len(r.Result)))
		}
		in.Response = newRecordedResponse(resp)
	}
	if *asJSON {
		if err := c.printJSON(in); err != nil {
			return c.fail("inspect", exitFailed, err)
		}
		return exitOK
	}
	writeInspection(c.stdout, in, time.Now())
	if in.Response != nil {
		writeResponse(c.stdout, in.Response)
	}
	return exitOK
}

// printJSON writes in to stdout as one indented JSON object.
func (c *cli) printJSON(in inspection) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(in)
}

// httpKeys returns the store keys the middleware may have recorded for a
// client's key in scope: the key of today's middleware (scope and key
// only), then those of earlier versions, which held route ('METHOD
// ROUTE'): a ServeMux pattern with its method, then without it.
func httpKeys(route, scope, key string) ([]string, error) {
	method, path, ok := strings.Cut(strings.TrimSpace(route), " ")
	path = strings.TrimSpace(path)
	if !ok || method == "" || path == "" || strings.ToUpper(method) != method {
		return nil, fmt.Errorf("--http: %q is not 'METHOD ROUTE', e.g. 'POST /payments'", route)
	}
	return []string{
		httprecord.Key(scope, key),
		httprecord.KeyV1(scope, method, method+" "+path, key),
		httprecord.KeyV1(scope, method, path, key),
	}, nil
}

// notFoundHint is what inspect adds when key has no record: the middleware
// keeps a client's key under its scope (and, in earlier versions, the
// method and route) too, so a client's
// key looked up alone is never found; nor is one looked up without the
// scope its middleware gave it.
func notFoundHint(httpRoute, scope, key string) string {
	switch {
	case httpRoute == "" && !isHTTPRecordKey(key):
		return fmt.Sprintf("; if %s is an Idempotency-Key the HTTP middleware recorded, give its route: idem inspect --http 'METHOD ROUTE' [--scope TENANT] %s",
			quoteKey(key), quoteKey(key))
	case httpRoute != "" && scope == "":
		return "; if the middleware's Scope names a tenant, give it with --scope TENANT"
	}
	return ""
}

// isHTTPRecordKey reports whether k is already a store key the middleware
// makes (httprecord.Key: "h2", or an earlier version's "h1", and the
// scope's length).
func isHTTPRecordKey(k string) bool {
	for _, v := range []string{"h2", "h1"} {
		if rest, ok := strings.CutPrefix(k, v); ok && rest != "" && rest[0] >= '0' && rest[0] <= '9' {
			return true
		}
	}
	return false
}

// lookupAny returns the record of the first of keys that has one, or
// idem.ErrNotFound.
func lookupAny(ctx context.Context, s idem.Store, keys []string) (*idem.Record, error) {
	lookup := s.Lookup
	if in, ok := s.(idem.Inspector); ok {
		lookup = in.Inspect // a lapsed claim too
	}
	for _, k := range keys {
		r, err := lookup(ctx, k)
		if !errors.Is(err, idem.ErrNotFound) {
			return r, err
		}
	}
	return nil, idem.ErrNotFound
}

// listQuarantined lists at most limit quarantined keys (all for 0) of the
// store sf names, as text or JSON (an array of inspections).
func (c *cli) listQuarantined(sf *storeFlags, limit int, asJSON bool) int {
	ctx := context.Background()
	b, err := sf.open(ctx, false, true)
	if err != nil {
		return c.fail("inspect", exitUsage, err)
	}
	defer b.close()
	b.allowEviction = true
	s, err := b.store(idem.Options{})
	if err != nil {
		return c.usageError("inspect", err)
	}
	rs, ok := s.(idem.Resolver)
	if !ok {
		return c.fail("inspect", exitUsage, fmt.Errorf("the store of %s (%T) cannot list quarantined keys", b.desc, s))
	}
	recs, err := rs.Quarantined(ctx, limit)
	if err != nil {
		return c.fail("inspect", exitFailed, err)
	}
	slices.SortFunc(recs, func(a, b *idem.Record) int { return strings.Compare(a.Key, b.Key) })
	ins := make([]inspection, len(recs))
	for i, r := range recs {
		ins[i] = newInspection(r)
	}
	if asJSON {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(ins); err != nil {
			return c.fail("inspect", exitFailed, err)
		}
		return exitOK
	}
	fmt.Fprintf(c.stdout, "%d quarantined keys in %s", len(ins), b.desc)
	if limit > 0 && len(ins) == limit {
		fmt.Fprintf(c.stdout, " (the first %d: --limit)", limit)
	}
	fmt.Fprintln(c.stdout)
	now := time.Now()
	for _, in := range ins {
		fmt.Fprintf(c.stdout, "%s  %d take-overs, last attempt %s token %d, quarantined for %v more\n",
			quoteKey(in.Key), in.TakeOvers, or(in.Owner, "-"), in.Token, in.Expires.Sub(now).Round(time.Second))
	}
	if len(ins) > 0 {
		fmt.Fprintln(c.stdout, "settle each with: idem resolve KEY --forget (run it again), or record it as done in its front door's form:\n"+
			"  "+settleHint(""))
	}
	return exitOK
}
