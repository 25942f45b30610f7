package main

// The console's live view: what the store can say cheaply, sampled every
// few seconds into a ring buffer of the last minutes, served as a page (or
// JSON) and drawn as a chart on the server.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/internal/redisadmin"
	"github.com/idemgo/idem/sqlstore"
)

// liveSample is one sample of the live view.
type liveSample struct {
	At time.Time `json:"at"`
	// Quarantined counts the quarantined keys, TakeOvers the live claims
	// that are take-overs (an earlier attempt's lease ran out under them);
	// Scanned, on Redis, the keys the bounded SCAN read (0 on SQL) and
	// Partial that it stopped at its bound before the end of the keyspace.
	Quarantined int  `json:"quarantined"`
	TakeOvers   int  `json:"takeovers"`
	Scanned     int  `json:"scanned"`
	Partial     bool `json:"partial"`
	// RTT is the round-trip time of one PING (Redis) or one SELECT 1
	// (SQL); Err what failed, "" when the sample is whole.
	RTT time.Duration `json:"rtt_ns"`
	Err string        `json:"error,omitempty"`
}

// liveCounter counts what a sample shows, on one store.
type liveCounter interface {
	// count fills s's counts and RTT, or returns why it could not.
	count(ctx context.Context, s *liveSample) error
	// how says how the counts are made, for the page.
	how() string
}

// redisCounter counts on Redis with a SCAN bounded to max keys over all
// masters: a keyspace of millions is not read every few seconds, and the
// page says when the bound cut a count short.
type redisCounter struct {
	c      redis.UniversalClient
	prefix string
	max    int
}

func (r *redisCounter) how() string {
	return fmt.Sprintf("a SCAN of at most %d keys (over every master), reading each record's first bytes: "+
		"the counts are of the keys it read, marked \"at least\" when the keyspace holds more", r.max)
}

// redisHead is how many bytes of a record the counter reads: its state and,
// for a claim, the fields up to the take-over count (record.lua's
// format), past an owner of hundreds of bytes and an attempt field that
// holds an abandoned attempt's reason (up to idem.MaxReasonBytes).
const redisHead = 2048

func (r *redisCounter) count(ctx context.Context, s *liveSample) error {
	start := time.Now()
	if err := r.c.Ping(ctx).Err(); err != nil {
		return err
	}
	s.RTT = time.Since(start)
	var mu sync.Mutex
	perMaster := r.max
	err := redisadmin.EachMaster(ctx, r.c, func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, escapeRedisGlob(r.prefix)+"{*}", 500).Iterator()
		var names []string
		for len(names) < perMaster && iter.Next(ctx) {
			names = append(names, iter.Val())
		}
		if err := iter.Err(); err != nil {
			return err
		}
		partial := len(names) == perMaster && iter.Next(ctx)
		q, t := 0, 0
		for page := names; len(page) > 0; {
			n := min(len(page), 500)
			cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, name := range page[:n] {
					p.GetRange(ctx, name, 0, redisHead-1)
					p.PTTL(ctx, name)
				}
				return nil
			})
			if err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
			for i := 0; i < len(cmds); i += 2 {
				head := cmds[i].(*redis.StringCmd).Val()
				pttl := cmds[i+1].(*redis.DurationCmd).Val()
				switch {
				case strings.HasPrefix(head, "2Q"):
					q++
				case strings.HasPrefix(head, "2C"):
					keep, n, ok := claimHead(head)
					// A claim lives keep ms past its lease: it is live
					// while its PTTL is at least keep.
					if ok && n > 0 && pttl >= time.Duration(keep)*time.Millisecond {
						t++
					}
				}
			}
			page = page[n:]
		}
		mu.Lock()
		s.Quarantined += q
		s.TakeOvers += t
		s.Scanned += len(names)
		s.Partial = s.Partial || partial
		mu.Unlock()
		return nil
	})
	return err
}

// claimHead reads a version 2 claim's keep and take-over count from the
// head of its record: 2C<token>:<#owner>:<owner><#attempt>:<attempt><keep>:<n>:
// (scripts/record.lua). ok is false when head is cut before them.
func claimHead(head string) (keep int64, n int, ok bool) {
	rest := head[2:]
	num := func() (int64, bool) {
		i := strings.IndexByte(rest, ':')
		if i <= 0 {
			return 0, false
		}
		v, err := strconv.ParseInt(rest[:i], 10, 64)
		rest = rest[i+1:]
		return v, err == nil && v >= 0
	}
	skip := func() bool {
		l, ok := num()
		if !ok || int64(len(rest)) < l {
			return false
		}
		rest = rest[l:]
		return true
	}
	if _, ok := num(); !ok { // the token
		return 0, 0, false
	}
	for range 2 { // the owner, then the attempt
		if !skip() {
			return 0, 0, false
		}
	}
	keep, ok1 := num()
	nn, ok2 := num()
	return keep, int(nn), ok1 && ok2
}

// escapeRedisGlob escapes the SCAN pattern's special characters in s, as
// the store does for its prefix.
func escapeRedisGlob(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// sqlCounter counts on SQL with one COUNT per figure: the table's index on
// expires_at bounds what each reads to the live rows.
type sqlCounter struct {
	db                *sql.DB
	quarantined, take string
}

func newSQLCounter(db *sql.DB, d sqlstore.Dialect, table string) *sqlCounter {
	if table == "" {
		table = sqlstore.DefaultTable
	}
	q := `"`
	now := "statement_timestamp()"
	switch d {
	case sqlstore.MySQL:
		q, now = "`", "UTC_TIMESTAMP(6)"
	case sqlstore.SQLite:
		now = "CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER)"
	}
	// sqlstore.New checked the name: identifiers of letters, digits and
	// underscores, with at most one schema.
	parts := strings.Split(table, ".")
	for i, p := range parts {
		parts[i] = q + p + q
	}
	t := strings.Join(parts, ".")
	return &sqlCounter{db: db,
		quarantined: "SELECT COUNT(*) FROM " + t + " WHERE state = 'Q' AND expires_at > " + now,
		take:        "SELECT COUNT(*) FROM " + t + " WHERE state = 'C' AND takeovers > 0 AND expires_at > " + now,
	}
}

func (q *sqlCounter) how() string {
	return "a COUNT of the table's live rows in each state (state 'Q'; state 'C' with takeovers > 0)"
}

func (q *sqlCounter) count(ctx context.Context, s *liveSample) error {
	start := time.Now()
	if _, err := q.db.ExecContext(ctx, "SELECT 1"); err != nil {
		return err
	}
	s.RTT = time.Since(start)
	if err := q.db.QueryRowContext(ctx, q.quarantined).Scan(&s.Quarantined); err != nil {
		return err
	}
	return q.db.QueryRowContext(ctx, q.take).Scan(&s.TakeOvers)
}

// liveView samples a liveCounter into a ring buffer.
type liveView struct {
	counter liveCounter
	every   time.Duration
	mu      sync.Mutex
	ring    []liveSample // the last len(ring) samples, oldest at next once full
	next    int
	full    bool
}

func newLiveView(c liveCounter, every, window time.Duration) *liveView {
	n := max(int(window/every), 2)
	return &liveView{counter: c, every: every, ring: make([]liveSample, n)}
}

// sample takes one sample now; each is bounded by the sampling interval,
// so a store that hangs shows as failed samples rather than a stalled view.
func (v *liveView) sample(ctx context.Context) liveSample {
	ctx, cancel := context.WithTimeout(ctx, v.every)
	defer cancel()
	s := liveSample{At: time.Now()}
	if err := v.counter.count(ctx, &s); err != nil {
		s.Err = oneLine(err.Error())
	}
	v.mu.Lock()
	v.ring[v.next] = s
	v.next = (v.next + 1) % len(v.ring)
	v.full = v.full || v.next == 0
	v.mu.Unlock()
	return s
}

// run samples every interval until ctx ends.
func (v *liveView) run(ctx context.Context) {
	t := time.NewTicker(v.every)
	defer t.Stop()
	v.sample(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			v.sample(ctx)
		}
	}
}

// samples returns the buffered samples, oldest first.
func (v *liveView) samples() []liveSample {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.full {
		return append([]liveSample(nil), v.ring[:v.next]...)
	}
	return append(append([]liveSample(nil), v.ring[v.next:]...), v.ring[:v.next]...)
}

// livePage is the live view's content.
type livePage struct {
	Latest  *liveSample
	How     string
	Every   time.Duration
	Counts  chart
	RTT     chart
	Samples int
}

func (con *console) live(w http.ResponseWriter, r *http.Request) {
	if con.cfg.Live == nil {
		con.fail(w, r, http.StatusNotFound, "This console samples nothing.")
		return
	}
	ss := con.cfg.Live.samples()
	lp := livePage{How: con.cfg.Live.counter.how(), Every: con.cfg.Live.every, Samples: len(ss)}
	if len(ss) > 0 {
		lp.Latest = &ss[len(ss)-1]
	}
	lp.Counts = newChart(ss, []series{
		{"quarantined keys", "q", func(s liveSample) float64 { return float64(s.Quarantined) }},
		{"live claims that are take-overs", "t", func(s liveSample) float64 { return float64(s.TakeOvers) }},
	}, "")
	lp.RTT = newChart(ss, []series{{"round-trip time (ms)", "r", func(s liveSample) float64 { return float64(s.RTT) / 1e6 }}}, " ms")
	con.render(w, r, http.StatusOK, "live", "Live", lp)
}

func (con *console) liveJSON(w http.ResponseWriter, r *http.Request) {
	if con.cfg.Live == nil {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		How     string       `json:"how"`
		Samples []liveSample `json:"samples"`
	}{con.cfg.Live.counter.how(), con.cfg.Live.samples()})
}

// series is one line of a chart.
type series struct {
	Name, Class string
	value       func(liveSample) float64
}

// chart is an SVG line chart drawn on the server: no script draws it.
type chart struct {
	W, H       int
	Lines      []chartLine
	Max        string // the top of the scale
	From, To   time.Time
	Empty      bool
	Failed     int // samples that failed: gaps in the lines
	ScaleLines []int
}

// chartLine is one series' polyline.
type chartLine struct {
	Name, Class, Points, Last string
}

func newChart(ss []liveSample, lines []series, unit string) chart {
	c := chart{W: 720, H: 160, Empty: len(ss) == 0, ScaleLines: []int{0, 40, 80, 120}}
	if len(ss) == 0 {
		return c
	}
	c.From, c.To = ss[0].At, ss[len(ss)-1].At
	top := 1.0
	for _, s := range ss {
		if s.Err != "" {
			c.Failed++
			continue
		}
		for _, l := range lines {
			top = max(top, l.value(s))
		}
	}
	span := c.To.Sub(c.From).Seconds()
	for _, l := range lines {
		var b strings.Builder
		last := "-"
		for _, s := range ss {
			if s.Err != "" {
				continue
			}
			x := float64(c.W)
			if span > 0 {
				x = s.At.Sub(c.From).Seconds() / span * float64(c.W)
			}
			y := float64(c.H) - l.value(s)/top*float64(c.H-4) - 2
			fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
			last = strconv.FormatFloat(l.value(s), 'f', -1, 64)
			if unit != "" {
				last = strconv.FormatFloat(l.value(s), 'f', 2, 64) + unit
			}
		}
		c.Lines = append(c.Lines, chartLine{Name: l.Name, Class: l.Class, Points: b.String(), Last: last})
	}
	c.Max = strconv.FormatFloat(top, 'f', -1, 64) + unit
	if unit != "" {
		c.Max = strconv.FormatFloat(top, 'f', 2, 64) + unit
	}
	return c
}
