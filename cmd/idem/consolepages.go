package main

// The console's read-only pages: the quarantined keys' list, one key's page
// (what idem inspect shows, and the recorded answer), and the lookup of a
// key typed in.

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/httprecord"
)

// keyRow is a quarantined key in the list.
type keyRow struct {
	ID, Name, FrontDoor string
	Owner               string
	Token               int64
	TakeOvers           int
	// Prior is the attempt before the last ("owner, claimed at"; "-"
	// for none), Expires the quarantine's end: formatted here, as a
	// template's function calls cost a list of 1,000 keys a third of its
	// time.
	Prior      string
	Checkpoint string // its size and first bytes (or hash)
	Expires    string
}

// listPage is the list's content.
type listPage struct {
	Rows     []keyRow
	More     bool // the store holds more than Limit
	Limit    int
	Err      string
	Latest   *liveSample
	LiveHow  string
	Forms    []pageForm
	Duration time.Duration
}

func (con *console) list(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
	defer cancel()
	lp := listPage{Limit: con.cfg.Limit}
	recs, err := con.res.Quarantined(ctx, con.cfg.Limit+1)
	if err != nil {
		lp.Err = oneLine(err.Error())
	}
	// The newest last attempt first: what crashed last is what the person
	// on call came for.
	slices.SortFunc(recs, func(a, b *idem.Record) int { return compareInt64(b.Token, a.Token) })
	if len(recs) > con.cfg.Limit {
		recs, lp.More = recs[:con.cfg.Limit], true
	}
	lp.Rows = make([]keyRow, 0, len(recs))
	for _, rec := range recs {
		prior := "-"
		if in := newInspection(rec); in.Prior != nil {
			prior = or(in.Prior.Owner, "-") + ", " + formatWhen(in.Prior.Claimed)
		}
		lp.Rows = append(lp.Rows, keyRow{ID: con.keyID(rec.Key), Name: con.keyName(rec.Key), FrontDoor: frontDoor(rec),
			Owner: or(rec.Owner, "-"), Token: rec.Token, TakeOvers: rec.TakeOvers, Prior: prior,
			Checkpoint: con.checkpoint(rec.Checkpoint), Expires: formatWhen(rec.Expires)})
	}
	if con.cfg.Live != nil {
		if ss := con.cfg.Live.samples(); len(ss) > 0 {
			lp.Latest = &ss[len(ss)-1]
		}
		lp.LiveHow = con.cfg.Live.counter.how()
	}
	lp.Duration = time.Since(start).Round(100 * time.Microsecond)
	con.render(w, r, http.StatusOK, "list", "Quarantined keys", lp)
}

func compareInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// checkpoint says a checkpoint's size and its first bytes (with --reveal)
// or its hash.
func (con *console) checkpoint(cp []byte) string {
	if cp == nil {
		return "none"
	}
	if !con.cfg.Reveal {
		return fmt.Sprintf("%d bytes, %s", len(cp), con.show(cp))
	}
	head := cp
	if len(head) > 48 {
		head = head[:48]
	}
	s := fmt.Sprintf("%d bytes: %s", len(cp), con.show(head))
	if len(head) < len(cp) {
		s += "…"
	}
	return s
}

// keyPage is a key's page: what idem inspect shows, and the settle forms.
type keyPage struct {
	ID, Name  string
	In        inspection
	FrontDoor string
	Record    bool // false: no live record
	// The recorded answer: Response for an HTTP response, Value for a Do
	// value (or its hash), Result for other bytes.
	Response   *shownResponse
	Value      string
	DoError    bool
	Result     string
	Checkpoint string
	Forms      []pageForm
	CanSettle  bool
	CanClear   bool
	Clear      pageForm
}

// shownResponse is a recorded HTTP response as the key page shows it.
type shownResponse struct {
	Status     int
	StatusText string
	Header     []string // "Name: value" lines, values hashed unless --reveal
	Body       string
	Omitted    bool
}

func (con *console) key(w http.ResponseWriter, r *http.Request) {
	key, ok := con.idKey(r.PathValue("id"))
	if !ok {
		con.fail(w, r, http.StatusNotFound, "Unknown key: this link is not one of this console's (a console's links last as long as it runs).")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	kp := keyPage{ID: r.PathValue("id"), Name: con.keyName(key), Forms: pageForms}
	rec, err := lookupAny(ctx, con.cfg.Store, []string{key}) // a lapsed attempt too
	switch {
	case errors.Is(err, idem.ErrNotFound):
		kp.In = inspection{Key: key, State: "none"}
	case errors.Is(err, idem.ErrDamaged):
		// No front door can read it: the way out is to clear it.
		kp.Record, kp.In = true, inspection{Key: key, State: "damaged", Error: oneLine(err.Error())}
		kp.CanClear = !con.cfg.ReadOnly
	case err != nil:
		con.fail(w, r, http.StatusBadGateway, fmt.Sprintf("Reading %s from %s: %s", kp.Name, con.cfg.Desc, oneLine(err.Error())))
		return
	default:
		kp.Record, kp.In, kp.FrontDoor = true, newInspection(rec), frontDoor(rec)
		kp.CanSettle = rec.Quarantined && !con.cfg.ReadOnly
		// Force clears any record but a live claim (Resolution.Force).
		kp.CanClear = !con.cfg.ReadOnly && (rec.Confirmed || rec.Quarantined || rec.Lapsed != nil)
		kp.Checkpoint = con.checkpoint(rec.Checkpoint)
		if rec.Confirmed {
			con.answer(&kp, rec)
		}
	}
	kp.Clear = clearForm
	con.render(w, r, http.StatusOK, "key", "Key "+kp.Name, kp)
}

// answer fills kp's recorded answer from a confirmed rec, in its front
// door's form.
func (con *console) answer(kp *keyPage, rec *idem.Record) {
	if resp, err := httprecord.Decode(rec.Result); err == nil && kp.FrontDoor == doorHTTP {
		rr := newRecordedResponse(resp)
		sr := &shownResponse{Status: rr.Status, StatusText: http.StatusText(rr.Status), Omitted: rr.BodyOmitted, Body: con.show(resp.Body)}
		for _, k := range slices.Sorted(func(yield func(string) bool) {
			for k := range rr.Header {
				if !yield(k) {
					return
				}
			}
		}) {
			for _, v := range rr.Header[k] {
				sr.Header = append(sr.Header, k+": "+con.show([]byte(v)))
			}
		}
		kp.Response = sr
		return
	}
	if kp.FrontDoor == doorDo {
		v := rec.Result
		if !rec.Resolved { // Do's own record: a tag byte, then the JSON
			v, kp.DoError = rec.Result[1:], rec.Result[0] == 'e'
		}
		if con.cfg.Reveal {
			kp.Value = string(v)
		} else {
			kp.Value = fmt.Sprintf("%d bytes of JSON, %s", len(v), con.show(v))
		}
		return
	}
	kp.Result = fmt.Sprintf("%d bytes, %s", len(rec.Result), con.show(rec.Result))
}

func (con *console) lookup(w http.ResponseWriter, r *http.Request) {
	key := r.PostFormValue("key")
	if r.PostFormValue("hex") != "" {
		b, err := hex.DecodeString(strings.TrimSpace(key))
		if err != nil {
			con.fail(w, r, http.StatusBadRequest, "The key is not hex: "+err.Error())
			return
		}
		key = string(b)
	}
	switch {
	case key == "":
		con.fail(w, r, http.StatusBadRequest, "Give a key to look up.")
		return
	case len(key) > consoleMaxKey:
		con.fail(w, r, http.StatusBadRequest, fmt.Sprintf("The key has %d bytes: a store's keys have at most %d.", len(key), consoleMaxKey))
		return
	}
	http.Redirect(w, r, "/key/"+con.keyID(key), http.StatusSeeOther)
}
