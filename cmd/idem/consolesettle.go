package main

// The console's settle forms: what the key page offers, read from its
// fields into settle.go's settleInput, so that the console and idem resolve
// settle a key the same way (the same forms, the same refusals, written
// once there); and the handler that asks the operator to confirm a settle,
// then makes it and logs who made it.

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/idemgo/idem"
)

// The front doors a record can come from, as the console names them.
const (
	doorHTTP    = "HTTP middleware"
	doorRPC     = "RPC (gRPC or Connect)"
	doorDo      = "Do"
	doorPlain   = "a consumer or the raw API (plain bytes)"
	doorUnknown = "Do, a consumer or the raw API (the key does not say)"
)

// frontDoor names the front door that wrote r, as settle.go tells it: by
// the key's shape for the HTTP middleware and the RPC interceptors, by
// the result of a confirmed record for Do; a quarantined key of Do or of a
// consumer carries nothing that tells them apart.
func frontDoor(r *idem.Record) string {
	form := keyForm(r.Key)
	if form == "" && r.Confirmed {
		form = recordForm(r.Key, r)
	}
	switch form {
	case formHTTP:
		return doorHTTP
	case formRPC:
		return doorRPC
	case formDo:
		return doorDo
	case formPlain:
		return doorPlain
	}
	return doorUnknown
}

// A pageForm is one way to settle a key on the console's key page.
type pageForm struct {
	Name  string // the form's value of the "form" field
	Label string // the button
	Help  string // what it does, said before the operator confirms
}

// pageForms are the console's settle forms, in the order the key page
// shows them; "clear" is offered for any record but a live claim.
var pageForms = []pageForm{
	{"forget", "Forget", "Remove the record: the next delivery or call runs the work again, as new."},
	{"do-json", "Confirm a Do value (JSON)", "Record the work as done; the next Do of the key decodes this JSON value into its result type and replays it."},
	{"http", "Confirm an HTTP response", "Record the work as done; the middleware replays this status, these headers and this body (only a status and headers it would record and replay are taken)."},
	{"rpc", "Confirm an RPC response message", "Record the work as done; the gRPC or Connect interceptor replays this message (its full type name, its wire encoding in hex)."},
	{"bytes", "Confirm plain bytes", "Record the work as done with these bytes as they are (text, or hex): a consumer's result (usually empty), a Do of a string."},
}

// clearForm clears any record but a live claim (Resolution.Force): a
// confirmed or damaged one too. The work then runs again.
var clearForm = pageForm{"clear", "Clear the record", "Delete the record whatever it holds (a confirmed or damaged one too): the next delivery or call runs the work again."}

// pageInput is what the operator typed into a settle form.
type pageInput struct {
	JSON   string // do-json: one JSON value
	Status string // http: the status code
	Header string // http: "Name: value" lines
	Body   string // http: the body, as text
	Type   string // rpc: the message's full type name
	Text   string // bytes: the result as text
	Hex    string // bytes, rpc: the result in hex (bytes: when Text is empty)
}

// errBadSettle marks an operator's input the console refuses before any
// write: the page says why.
var errBadSettle = errors.New("bad settle input")

// pageResolution turns form and in into the Resolution that settles key
// in the form its front door replays (settleResolution), or an error
// wrapping errBadSettle that says what is wrong, before anything is
// written.
func pageResolution(key, form string, in pageInput) (idem.Resolution, error) {
	bad := func(err error) (idem.Resolution, error) {
		return idem.Resolution{}, fmt.Errorf("%w: %w", errBadSettle, err)
	}
	var (
		sf settleForm
		si settleInput
	)
	switch form {
	case "forget":
		si.Forget = true
	case "clear":
		si.Forget, si.Force = true, true
	case "do-json":
		sf, si.Value = formDo, []byte(strings.TrimSpace(in.JSON))
	case "http":
		st, err := strconv.Atoi(strings.TrimSpace(in.Status))
		if err != nil {
			return bad(fmt.Errorf("the HTTP status %q is not a number", in.Status))
		}
		h := http.Header{}
		for i, line := range strings.Split(strings.ReplaceAll(in.Header, "\r\n", "\n"), "\n") {
			if strings.TrimSpace(line) == "" {
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			k = strings.TrimSpace(k)
			if !ok || k == "" || strings.ContainsAny(k, " \t") {
				return bad(fmt.Errorf("header line %d, %q, is not 'Name: value'", i+1, line))
			}
			h.Add(textproto.CanonicalMIMEHeaderKey(k), strings.TrimSpace(v))
		}
		sf, si.Status, si.Header, si.Body = formHTTP, st, h, []byte(in.Body)
	case "rpc":
		b, err := hex.DecodeString(strings.TrimSpace(in.Hex))
		if err != nil {
			return bad(fmt.Errorf("the message's hex does not decode: %w", err))
		}
		sf, si.Type, si.Value = formRPC, strings.TrimSpace(in.Type), b
	case "bytes":
		if in.Text != "" && in.Hex != "" {
			return bad(errors.New("give the result as text or as hex, not both"))
		}
		sf, si.Value = formPlain, []byte(in.Text)
		if in.Hex != "" {
			b, err := hex.DecodeString(strings.TrimSpace(in.Hex))
			if err != nil {
				return bad(fmt.Errorf("the hex result does not decode: %w", err))
			}
			si.Value = b
		}
	default:
		return bad(fmt.Errorf("unknown settle form %q", form))
	}
	if !si.Forget {
		if err := checkKeyForm(key, sf); err != nil {
			return bad(err)
		}
	}
	r, err := settleResolution(sf, si)
	if err != nil {
		return bad(err)
	}
	return r, nil
}

// confirmPage asks the operator to confirm a settle.
type confirmPage struct {
	ID, Name, Form, Label, Help string
	Input                       pageInput
	Bytes                       int
	Confirm                     bool
}

// donePage says what a settle did.
type donePage struct {
	ID, Name, What string
}

func (con *console) settle(w http.ResponseWriter, r *http.Request) {
	if con.cfg.ReadOnly {
		con.fail(w, r, http.StatusForbidden, "This console is read-only (--read-only): it settles nothing.")
		return
	}
	id := r.PostFormValue("id")
	key, ok := con.idKey(id)
	if !ok {
		con.fail(w, r, http.StatusBadRequest, "Unknown key: this form is not one of this console's (reload the key's page).")
		return
	}
	name := con.keyName(key)
	form := r.PostFormValue("form")
	in := pageInput{JSON: r.PostFormValue("json"), Status: r.PostFormValue("status"), Header: r.PostFormValue("header"),
		Body: r.PostFormValue("body"), Type: r.PostFormValue("type"), Text: r.PostFormValue("text"), Hex: r.PostFormValue("hex")}
	res, err := pageResolution(key, form, in)
	if err != nil {
		con.render(w, r, http.StatusBadRequest, "error", "Not settled", errorPage{Message: "Nothing was written: " + strings.TrimPrefix(err.Error(), errBadSettle.Error()+": ") + ".", Back: "/key/" + id})
		return
	}
	var sf pageForm
	for _, f := range append(pageForms, clearForm) {
		if f.Name == form {
			sf = f
		}
	}
	if r.PostFormValue("step") != "do" {
		con.render(w, r, http.StatusOK, "confirm", "Settle "+name+"?", confirmPage{ID: id, Name: name, Form: form,
			Label: sf.Label, Help: sf.Help, Input: in, Bytes: len(res.Result), Confirm: res.Confirm})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	who := r.Context().Value(whoKey{}).(session).name
	if err := con.res.Resolve(ctx, key, res); err != nil {
		if errors.Is(err, idem.ErrNotFound) {
			con.render(w, r, http.StatusConflict, "error", "Not settled", errorPage{Message: fmt.Sprintf("Key %s is not quarantined (settled already, or never was): left as it is.", name), Back: "/key/" + id})
			return
		}
		fmt.Fprintf(con.cfg.Log, "idem console: settle by %s: %s of key %s in %s failed: %s\n", who, form, name, con.cfg.Desc, oneLine(err.Error()))
		con.fail(w, r, http.StatusBadGateway, "Settling failed: "+oneLine(err.Error()))
		return
	}
	what := fmt.Sprintf("forgotten: the next delivery or call of key %s runs the work as new", name)
	if res.Confirm {
		what = fmt.Sprintf("recorded as done (%s, %d bytes): every duplicate of key %s is answered with it", sf.Label, len(res.Result), name)
	}
	fmt.Fprintf(con.cfg.Log, "idem console: settle by %s: %s of key %s (%d bytes of result) in %s\n", who, form, name, len(res.Result), con.cfg.Desc)
	con.render(w, r, http.StatusOK, "done", "Settled", donePage{ID: id, Name: name, What: what})
}
