package main

// The console's settle forms, in one place: which front door wrote a
// record, and a form's input turned into the idem.Resolution that front
// door replays. Issue 44 ("Settled by the operator") puts this logic in one
// place for idem resolve, the Resolver API and the console; until it lands
// this file holds the console's side of it, written with what exists today,
// so that the merge re-points these functions and nothing else.

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/httprecord"
)

// The front doors a record can come from, as the console names them.
const (
	doorHTTP    = "HTTP middleware"
	doorRPC     = "RPC (gRPC or Connect)"
	doorDo      = "Do"
	doorUnknown = "Do, a consumer or the raw API (the key does not say)"
)

// frontDoor names the front door that wrote r: the HTTP middleware's and
// the RPC interceptors' keys say so by their prefix (httprecord.Key "h2",
// its earlier "h1", the RPC servers' "g1"); a confirmed record of Do says so
// by its result's first byte and JSON. A quarantined key of Do or of a
// consumer carries nothing that tells them apart.
func frontDoor(r *idem.Record) string {
	switch {
	case isHTTPRecordKey(r.Key):
		return doorHTTP
	case strings.HasPrefix(r.Key, "g1") && len(r.Key) > 2 && r.Key[2] >= '0' && r.Key[2] <= '9':
		return doorRPC
	case r.Confirmed && len(r.Result) > 0 && (r.Result[0] == 'v' || r.Result[0] == 'e') && json.Valid(r.Result[1:]):
		return doorDo
	}
	return doorUnknown
}

// A settleForm is one way to settle a key on the console's key page.
type settleForm struct {
	Name  string // the form's value of the "form" field
	Label string // the button
	Help  string // what it does, said before the operator confirms
}

// settleForms are the console's settle forms, in the order the key page
// shows them.
var settleForms = []settleForm{
	{"forget", "Forget", "Remove the record: the next delivery or call runs the work again, as new."},
	{"do-json", "Confirm a Do value (JSON)", "Record the work as done; the next Do of the key replays this JSON value as its result."},
	{"http", "Confirm an HTTP response", "Record the work as done; the middleware replays this status, these headers and this body."},
	{"bytes", "Confirm plain bytes", "Record the work as done with these bytes as they are (text, or hex): a consumer's result (usually empty), an RPC's encoded response message."},
}

// settleInput is what the operator typed into a settle form.
type settleInput struct {
	JSON   string // do-json: one JSON value
	Status string // http: the status code, 100-599
	Header string // http: "Name: value" lines
	Body   string // http: the body, as text
	Text   string // bytes: the result as text
	Hex    string // bytes: the result in hex, when Text is empty
}

// errBadSettle marks an operator's input the console refuses before any
// write: the page says why.
var errBadSettle = errors.New("bad settle input")

// settleResolution turns form and in into the Resolution that settles a
// key in the form its front door replays, or an error wrapping
// errBadSettle that names the field.
func settleResolution(form string, in settleInput) (idem.Resolution, error) {
	bad := func(format string, a ...any) (idem.Resolution, error) {
		return idem.Resolution{}, fmt.Errorf("%w: %s", errBadSettle, fmt.Sprintf(format, a...))
	}
	switch form {
	case "forget":
		return idem.Resolution{}, nil
	case "do-json":
		v := strings.TrimSpace(in.JSON)
		if v == "" || !json.Valid([]byte(v)) {
			return bad("the Do value is not JSON: give one JSON value, e.g. {\"id\": 7} or \"done\"")
		}
		// Do replays a result recorded as 'v' and the value's JSON
		// (do.go, resultValue): the form it reads today.
		return idem.Resolution{Confirm: true, Result: append([]byte{'v'}, v...)}, nil
	case "http":
		st, err := strconv.Atoi(strings.TrimSpace(in.Status))
		if err != nil || st < 100 || st > 599 {
			return bad("the HTTP status %q is not a number from 100 to 599", in.Status)
		}
		h := http.Header{}
		for i, line := range strings.Split(strings.ReplaceAll(in.Header, "\r\n", "\n"), "\n") {
			if strings.TrimSpace(line) == "" {
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			k = strings.TrimSpace(k)
			if !ok || k == "" || strings.ContainsAny(k, " \t") {
				return bad("header line %d, %q, is not 'Name: value'", i+1, line)
			}
			h.Add(textproto.CanonicalMIMEHeaderKey(k), strings.TrimSpace(v))
		}
		return idem.Resolution{Confirm: true, Result: httprecord.Encode(&httprecord.Response{Status: st, Header: h, Body: []byte(in.Body)})}, nil
	case "bytes":
		if in.Text != "" && in.Hex != "" {
			return bad("give the result as text or as hex, not both")
		}
		if in.Hex != "" {
			b, err := hex.DecodeString(strings.TrimSpace(in.Hex))
			if err != nil {
				return bad("the hex result does not decode: %v", err)
			}
			return idem.Resolution{Confirm: true, Result: b}, nil
		}
		return idem.Resolution{Confirm: true, Result: []byte(in.Text)}, nil
	}
	return bad("unknown settle form %q", form)
}

// canClear reports whether the console can clear a damaged or confirmed
// record. Not yet: Resolver.Resolve settles a quarantined key only; issue
// 44 adds clearing (idem resolve --forget --force) and re-points this.
const canClear = false
