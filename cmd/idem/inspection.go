package main

// What idem inspect shows of a record, which the console's key page reuses:
// the record read into an inspection (its --json object) and a recorded
// HTTP response, written as aligned text, with a key, a header or a body
// quoted where it would garble the terminal, and the hint that says how to
// settle a key in its front door's form.

import (
	"encoding/hex"
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
