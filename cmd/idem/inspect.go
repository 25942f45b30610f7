package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

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

// inspection is inspect's --json output: one object, stable field names.
type inspection struct {
	Key   string `json:"key"`
	State string `json:"state"` // "claimed", "lapsed", "confirmed", "quarantined", "damaged", or "none": no record
	// Error says why there is no record to show (state "none"); the
	// command exits 1 then, as without --json.
	Error   string    `json:"error,omitempty"`
	Owner   string    `json:"owner"` // "" once confirmed
	Token   int64     `json:"token"`
	Expires time.Time `json:"expires"` // of a lapsed claim: when the store forgets it
	// Claimed is when a lapsed claim (state "lapsed") was claimed.
	Claimed     *time.Time `json:"claimed,omitempty"`
	Fingerprint string     `json:"fingerprint"` // hex; "" for none
	ResultBytes int        `json:"result_bytes"`
	// TakeOvers counts a claim's or a quarantined key's take-overs in a
	// row; Prior is the attempt taken over last; Checkpoint the last
	// progress recorded (text, else CheckpointBase64).
	TakeOvers int      `json:"takeovers,omitempty"`
	Prior     *attempt `json:"prior,omitempty"`
	// Ended is why the claim's own attempt gave the key up, as its holder
	// said (a failed Reconcile of idem.Do: "Reconcile failed: ..."); ""
	// when it said nothing, which for a lapsed or quarantined key means
	// its lease ran out: a crash or a stall.
	Ended            string  `json:"ended,omitempty"`
	Checkpoint       *string `json:"checkpoint,omitempty"`
	CheckpointBase64 []byte  `json:"checkpoint_base64,omitempty"`
	// Response is the recorded HTTP response, with --result only.
	Response *recordedResponse `json:"response,omitempty"`
	// Resolved marks a confirmation an operator recorded (idem resolve).
	Resolved bool `json:"resolved,omitempty"`
	// Form is the front door whose form a confirmation's result is in, as
	// far as the key and the result tell: "do", "http", "rpc" or "plain".
	Form string `json:"form,omitempty"`
	// Unreadable says why the key's front door cannot replay its result
	// (a middleware key settled with another form); "" when it can.
	Unreadable string `json:"unreadable,omitempty"`
}

// attempt is an earlier attempt at a key, as inspect shows it.
type attempt struct {
	Owner   string    `json:"owner"`
	Token   int64     `json:"token"`
	Claimed time.Time `json:"claimed"`
}

// recordedResponse is an HTTP response as the middleware recorded it.
type recordedResponse struct {
	Status          int                 `json:"status"`
	Header          map[string][]string `json:"header"`
	OriginalRequest string              `json:"original_request,omitempty"` // the request id; "" for none
	BodyOmitted     bool                `json:"body_omitted,omitempty"`     // over MaxResponseBytes: not recorded
	Body            string              `json:"body"`                       // when it is text
	BodyBase64      []byte              `json:"body_base64,omitempty"`      // when it is not
}

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

func newRecordedResponse(r *httprecord.Response) *recordedResponse {
	out := &recordedResponse{Status: r.Status, Header: r.Header, OriginalRequest: r.RequestID, BodyOmitted: r.BodyOmitted}
	if isText(r.Body) {
		out.Body = string(r.Body)
	} else {
		out.BodyBase64 = r.Body
	}
	return out
}

// isText reports whether b prints as it is: UTF-8 without control
// characters other than tab and line ends.
func isText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) && r != '\t' && r != '\n' && r != '\r' {
			return false
		}
	}
	return true
}

// headerValue prints a header value as is when it is text on one line,
// quoted otherwise, so that a recorded value cannot garble the terminal.
func headerValue(v string) string {
	if isText([]byte(v)) && !strings.ContainsAny(v, "\r\n") {
		return v
	}
	return strconv.Quote(v)
}

// writeResponse writes a recorded response after the inspection, as the
// replay would send it (Original-Request and Idempotent-Replayed included),
// the headers sorted; a body that is not text is summarised, and left to
// --json.
func writeResponse(w io.Writer, r *recordedResponse) {
	fmt.Fprintf(w, "\nHTTP %d %s\n", r.Status, http.StatusText(r.Status))
	header := http.Header(maps.Clone(r.Header))
	if r.OriginalRequest != "" {
		header.Set("Original-Request", r.OriginalRequest)
	}
	header.Set("Idempotent-Replayed", "true")
	if r.BodyOmitted {
		header.Set("Idempotent-Body-Omitted", "true")
	}
	for _, k := range slices.Sorted(maps.Keys(header)) {
		for _, v := range header[k] {
			fmt.Fprintf(w, "%s: %s\n", k, headerValue(v))
		}
	}
	fmt.Fprintln(w)
	switch {
	case r.BodyOmitted:
		fmt.Fprintln(w, "(the body was over MaxResponseBytes: not recorded)")
	case r.BodyBase64 != nil:
		fmt.Fprintf(w, "(%d bytes, not text: --json shows them in base64)\n", len(r.BodyBase64))
	default:
		fmt.Fprint(w, r.Body)
		if r.Body != "" && !strings.HasSuffix(r.Body, "\n") {
			fmt.Fprintln(w)
		}
	}
}

func newInspection(r *idem.Record) inspection {
	in := inspection{
		Key: r.Key, State: "claimed", Owner: r.Owner, Token: r.Token,
		Expires: r.Expires.UTC(), Fingerprint: hex.EncodeToString(r.Fingerprint), ResultBytes: len(r.Result),
		TakeOvers: r.TakeOvers, Resolved: r.Resolved, Ended: r.Ended,
	}
	switch {
	case r.Confirmed:
		in.State = "confirmed"
	case r.Quarantined:
		in.State = "quarantined"
	case r.Lapsed != nil:
		in.State = "lapsed"
		at := r.Lapsed.Claimed.UTC()
		in.Claimed = &at
	}
	if r.Prior != nil {
		in.Prior = &attempt{Owner: r.Prior.Owner, Token: r.Prior.Token, Claimed: r.Prior.Claimed.UTC()}
	}
	if r.Checkpoint != nil {
		if isText(r.Checkpoint) {
			cp := string(r.Checkpoint)
			in.Checkpoint = &cp
		} else {
			in.CheckpointBase64 = r.Checkpoint
		}
	}
	return in
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

// writeInspection writes in as aligned text; now dates the expiry.
func writeInspection(w io.Writer, in inspection, now time.Time) {
	row := func(name, v string) { fmt.Fprintf(w, "%-12s %s\n", name, v) }
	row("key", quoteKey(in.Key))
	row("state", in.State)
	row("owner", or(in.Owner, "-"))
	row("token", strconv.FormatInt(in.Token, 10))
	what := "lease ends"
	switch in.State {
	case "confirmed":
		what = "retention ends"
	case "quarantined":
		what = "quarantine ends"
	case "lapsed":
		what = "the store forgets it"
	}
	if in.Claimed != nil {
		row("claimed", in.Claimed.Format(time.RFC3339Nano))
	}
	row("expires", fmt.Sprintf("%s (%s in %v)", in.Expires.Format(time.RFC3339Nano), what, in.Expires.Sub(now).Round(time.Millisecond)))
	row("fingerprint", or(in.Fingerprint, "-"))
	row("result", fmt.Sprintf("%d bytes", in.ResultBytes))
	if in.State == "confirmed" {
		if f, ok := formNames[settleForm(in.Form)]; ok {
			row("form", f)
		}
		if in.Resolved {
			row("settled", "by an operator (idem resolve): the result is in its front door's plain form")
		}
		if in.Unreadable != "" {
			fmt.Fprintf(w, "\nThe key's front door cannot replay this record: %s.\n"+
				"Clear it with idem resolve %s --forget --force (the work then runs again).\n", in.Unreadable, quoteKey(in.Key))
		}
		return
	}
	row("take-overs", strconv.Itoa(in.TakeOvers))
	switch {
	case in.Ended != "":
		row("ended", "abandoned by its holder: "+in.Ended)
	case in.State == "lapsed" || in.State == "quarantined":
		row("ended", "its lease ran out: a crash or a stall")
	}
	if in.Prior != nil {
		row("prior", fmt.Sprintf("owner %s, token %d, claimed %s", or(in.Prior.Owner, "-"), in.Prior.Token, in.Prior.Claimed.Format(time.RFC3339Nano)))
	}
	switch {
	case in.Checkpoint != nil:
		row("checkpoint", strconv.Quote(*in.Checkpoint))
	case in.CheckpointBase64 != nil:
		row("checkpoint", fmt.Sprintf("%d bytes, not text: --json shows them in base64", len(in.CheckpointBase64)))
	default:
		row("checkpoint", "-")
	}
	if in.State == "lapsed" {
		how := "its worker crashed or stalled"
		if in.Ended != "" {
			how = "its holder gave it up and said why (see ended): it did not crash"
		}
		fmt.Fprintf(w, "\nThis attempt's lease ran out, neither confirmed nor forgotten: %s,\n"+
			"maybe after part of the work. The next claim takes it over and is told so\n"+
			"(take-over %d in a row), resuming after its checkpoint.\n", how, in.TakeOvers+1)
	}
	if in.State == "quarantined" {
		last := "the last one's lease ran out under it (a crash or a stall)"
		if in.Ended != "" {
			last = "the last one was given up by its holder, which said why (see ended)"
		}
		fmt.Fprintf(w, "\nThe key's %d attempts in a row each ended unconfirmed and unforgotten; %s.\n"+
			"Nothing runs it again until an operator settles it: idem resolve %s --forget\n"+
			"(run it again), or record it as done: %s\n", in.TakeOvers+1, last, quoteKey(in.Key), settleHint(in.Key))
	}
}

// settleHint says how to record key as done in its front door's form, as
// idem resolve --help does; "" stands for any key.
func settleHint(key string) string {
	switch keyForm(key) {
	case formHTTP:
		return "--http-status CODE [--header 'Name: value']... [--body TEXT] (the response its retries get)"
	case formRPC:
		return "in Go with the gRPC or Connect module's Resolution (a response message)"
	}
	if key == "" {
		return "--do JSON (idem.Do: the value's JSON) | --http-status CODE [--header H] [--body TEXT] (the HTTP middleware) | --confirm RESULT (as it is: a consumer's, --confirm '')"
	}
	return "--do JSON (a key of idem.Do: the JSON of its value) | --confirm RESULT (as it is: a consumer's key, --confirm '')"
}

// quoteKey prints a key as is when it is plain text, quoted otherwise, so
// that a key with control bytes cannot garble the terminal.
func quoteKey(k string) string {
	if utf8.ValidString(k) && strconv.Quote(k) == `"`+k+`"` {
		return k
	}
	return strconv.Quote(k)
}
