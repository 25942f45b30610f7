package main

// How an operator settles a key, in the form its front door replays:
// written once, for idem resolve and idem console alike.
//
//	type settleForm            the front door's form: formDo, formHTTP, formRPC, formPlain
//	type settleInput           what the operator gives: a value, or a status, headers and body
//	settleResolution(form, in) the idem.Resolution to pass to Resolver.Resolve, or an
//	                           error naming what the front door could not replay, before
//	                           anything is written
//	keyForm(key)               the front door a store key belongs to, when its shape tells
//	                           (the middleware's h1/h2 keys, the RPC interceptors' g1 keys)
//	checkKeyForm(key, form)    refuses a form the key's front door does not read
//	recordForm(key, rec)       which front door wrote a record that holds a result
//	replayable(key, rec)       why that front door cannot replay rec (nil when it can)

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/httprecord"
	"github.com/idemgo/idem/middleware"
	"github.com/idemgo/idem/middleware/rpccore"
)

// settleForm is the form in which a front door records a key's result,
// and so the form in which an operator settles the key.
type settleForm string

const (
	// formDo is idem.Do's: the JSON of the value (the text as it is for a
	// Do whose result type is string or []byte: formPlain).
	formDo settleForm = "do"
	// formHTTP is the HTTP middleware's: a status, replayed headers and a
	// body, as middleware.Resolution builds them.
	formHTTP settleForm = "http"
	// formRPC is the gRPC and Connect interceptors': a response message
	// (its full type name and wire encoding), as rpccore.Resolution, and
	// their modules' Resolution in Go, build it.
	formRPC settleForm = "rpc"
	// formPlain is the bytes as they are: the consumer wrappers' (which
	// replay no result), the raw API's, and a Do whose result type is
	// string or []byte.
	formPlain settleForm = "plain"
)

// formNames say whose form each is, as idem inspect prints it.
var formNames = map[settleForm]string{
	formDo:    "idem.Do's (the value's JSON, after a tag byte unless an operator wrote it)",
	formHTTP:  "the HTTP middleware's (a recorded response: --result shows it)",
	formRPC:   "the gRPC or Connect interceptors' (a response message)",
	formPlain: "plain bytes (a consumer's, the raw API's, a Do of a string)",
}

// settleInput is an operator's verdict, as given.
type settleInput struct {
	// Forget removes the record (the work runs again); Force clears any
	// record but a live claim (see idem.Resolution.Force).
	Forget, Force bool
	// Value is the result: for formDo the JSON of the value, for
	// formPlain its bytes, for formRPC the response message's wire
	// encoding.
	Value []byte
	// Type is formRPC's message's full type name (acme.orders.v1.Order).
	Type string
	// Status, Header and Body are formHTTP's response.
	Status int
	Header http.Header
	Body   []byte
}

// settleResolution builds the Resolution of in for a key of form's front
// door, refusing, before anything is written, what that front door could
// not replay: JSON that does not parse for Do, a response the middleware
// would not record or replay as given. With Forget the form is not read.
func settleResolution(form settleForm, in settleInput) (idem.Resolution, error) {
	if in.Forget {
		return idem.Resolution{Force: in.Force}, nil
	}
	if in.Force {
		return idem.Resolution{}, errors.New("--force goes with --forget: it clears a key, it records no result")
	}
	switch form {
	case formDo:
		if !json.Valid(in.Value) {
			return idem.Resolution{}, fmt.Errorf("the result for idem.Do is not JSON: %.60q; give the JSON of the value (a string result as it is: --confirm)", in.Value)
		}
		return idem.Resolution{Confirm: true, Result: nonNilBytes(in.Value)}, nil
	case formPlain:
		return idem.Resolution{Confirm: true, Result: nonNilBytes(in.Value)}, nil
	case formHTTP:
		return middleware.Resolution(in.Status, in.Header, in.Body, middleware.Options{})
	case formRPC:
		if in.Type == "" {
			return idem.Resolution{}, errors.New("a key of the gRPC or Connect interceptors is settled with a response message: give its full type name (--rpc-type acme.orders.v1.Order) and its wire encoding (--confirm-hex, e.g. from protoc --encode), or --forget")
		}
		return rpccore.Resolution(in.Type, nonNilBytes(in.Value), nil, nil)
	}
	return idem.Resolution{}, fmt.Errorf("unknown settle form %q", form)
}

func nonNilBytes(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// keyForm is the front door a store key belongs to when its shape tells:
// formHTTP for the middleware's keys (h2, and h1 of earlier versions),
// formRPC for the RPC interceptors' (g1); "" for any other key (Do's, a
// consumer's, the raw API's: the key does not say which).
func keyForm(key string) settleForm {
	if len(key) < 2 {
		return ""
	}
	parts := map[string]int{"h2": 2, "h1": 4, "g1": 2}[key[:2]]
	if parts == 0 || !lengthPrefixed(key[2:], parts) {
		return ""
	}
	if key[0] == 'g' {
		return formRPC
	}
	return formHTTP
}

// lengthPrefixed reports whether s is exactly n parts, each its length in
// decimal, ':', and its bytes.
func lengthPrefixed(s string, n int) bool {
	for range n {
		i := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == 0 || i >= len(s) || s[i] != ':' {
			return false
		}
		l, err := strconv.Atoi(s[:i])
		if err != nil || l > len(s)-i-1 {
			return false
		}
		s = s[i+1+l:]
	}
	return s == ""
}

// checkKeyForm refuses to settle key in form when the key's shape says
// that its front door reads another: a middleware key given a Do value
// would answer every retry 500, a Do key given a response would be
// damaged for Do.
func checkKeyForm(key string, form settleForm) error {
	kf := keyForm(key)
	switch {
	case kf == form, kf == "" && (form == formDo || form == formPlain):
		return nil
	case kf == formHTTP:
		return errors.New("the key is the HTTP middleware's (h2<len>:<scope><len>:<client key>): settle it with the response its retries get (--http-status, --header, --body), or --forget")
	case kf == formRPC:
		return errors.New("the key is the gRPC or Connect interceptors' (g1...): settle it with a response message (--rpc-type NAME --confirm-hex HEX), in Go with the module's Resolution, or --forget")
	}
	return errors.New("--http-status settles a key of the HTTP middleware, whose keys look like h2<len>:<scope><len>:<client key> (idem inspect --quarantined lists them); this key is not one")
}

// recordForm is which front door wrote rec, a record that holds a
// result: the key's shape says it for the middleware and the RPC
// interceptors; otherwise a result Do recorded begins with its tag byte
// ('v' or 'e'), and an operator's (rec.Resolved) is taken for Do's when it
// is JSON. Anything else is formPlain.
func recordForm(key string, rec *idem.Record) settleForm {
	if f := keyForm(key); f != "" {
		return f
	}
	if rec.Resolved {
		if json.Valid(rec.Result) {
			return formDo
		}
		return formPlain
	}
	if len(rec.Result) > 0 && (rec.Result[0] == 'v' || rec.Result[0] == 'e') {
		return formDo
	}
	return formPlain
}

// replayable says why the front door of key cannot replay rec's result,
// or nil when it can or the command cannot tell: a middleware key whose
// result is not a response (settled with another form by mistake).
func replayable(key string, rec *idem.Record) error {
	if !rec.Confirmed || keyForm(key) != formHTTP {
		return nil
	}
	if _, err := httprecord.Decode(rec.Result); err != nil {
		return errors.New("its result is not a response the HTTP middleware can replay: every retry gets 500")
	}
	return nil
}
