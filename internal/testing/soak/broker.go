package soak

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one worker process.
type proc struct {
	slot     int
	name     string
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	started  time.Time
	inflight int
	usable   bool // deliveries may be sent: neither killed nor told to stop
	killed   bool
	exited   bool
	stderr   *syncBuffer
}

// event is a line from a worker, or its exit (exit set, err from Wait).
type event struct {
	p    *proc
	line string
	exit bool
	err  error
}

type pending struct {
	id       string
	p        *proc
	deadline time.Time
}

type delayed struct {
	id string
	at time.Time
}

type broker struct {
	cfg    Config
	target target
	rnd    *rand.Rand
	ev     Evidence
	rep    *Report

	events   chan event
	quit     chan struct{} // closed when run returns: readers stop sending
	procs    []*proc       // by slot: the current process
	all      []*proc
	gen      int
	ready    []string
	head     int
	delayed  []delayed
	inflight map[uint64]*pending
	tag      uint64
	acked    map[string]bool
	ackedIDs []string
	stopping bool
}

func newBroker(cfg Config, t target) *broker {
	return &broker{
		cfg: cfg, target: t,
		rnd:      rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		ev:       NewEvidence(),
		rep:      &Report{Mode: cfg.Mode, Messages: cfg.Messages, Workers: cfg.Workers, LeaseEvents: map[string]int{}},
		events:   make(chan event, 4096),
		quit:     make(chan struct{}),
		procs:    make([]*proc, cfg.Workers),
		inflight: map[uint64]*pending{},
		acked:    map[string]bool{},
	}
}

// publish fills the queue: every id once, and a share of them twice, the
// copy a little later, so that both copies are often in flight at once.
func (b *broker) publish(ids []string) {
	type item struct {
		id  string
		pos float64
	}
	items := make([]item, 0, len(ids)+int(float64(len(ids))*b.cfg.DupRate)+1)
	for i, id := range ids {
		items = append(items, item{id, float64(i)})
		if b.rnd.Float64() < b.cfg.DupRate {
			items = append(items, item{id, float64(i) + 0.5 + b.rnd.Float64()*float64(2*b.cfg.Prefetch)})
			b.rep.DupsPublished++
		}
	}
	slices.SortStableFunc(items, func(a, c item) int { return cmp.Compare(a.pos, c.pos) })
	for _, it := range items {
		b.ready = append(b.ready, it.id)
	}
}

func (b *broker) run(ctx context.Context, ids []string) (rep *Report, err error) {
	b.publish(ids)
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	defer close(b.quit)
	defer func() {
		if err != nil {
			b.killAll()
			err = fmt.Errorf("soak: %w (acked %d of %d, queued %d, delayed %d, in flight %d)%s",
				err, len(b.ackedIDs), b.cfg.Messages, len(b.ready)-b.head, len(b.delayed), len(b.inflight), b.stderrs())
		}
	}()
	start := time.Now()
	for slot := range b.procs {
		if err := b.spawn(slot); err != nil {
			return b.rep, err
		}
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	nextKill := b.nextKill(start)
	lastLog := start
	for !b.done() {
		select {
		case <-ctx.Done():
			return b.rep, fmt.Errorf("the run did not finish: %w", context.Cause(ctx))
		case e := <-b.events:
			if err := b.handle(e); err != nil {
				return b.rep, err
			}
		case now := <-tick.C:
			b.housekeep(now)
			if b.cfg.KillEvery > 0 && now.After(nextKill) {
				b.killRandom(now)
				nextKill = b.nextKill(now)
			}
			if now.Sub(lastLog) >= 10*time.Second {
				lastLog = now
				b.cfg.Logf("soak %s: %v acked %d/%d, in flight %d, queued %d, kills %d",
					b.cfg.Mode, now.Sub(start).Round(time.Second), len(b.ackedIDs), b.cfg.Messages, len(b.inflight), len(b.ready)-b.head, b.rep.Kills)
			}
		}
		if err := b.dispatch(); err != nil {
			return b.rep, err
		}
	}
	b.rep.Elapsed = time.Since(start)
	return b.rep, b.stop(ctx)
}

func (b *broker) nextKill(now time.Time) time.Time {
	if b.cfg.KillEvery <= 0 {
		return now
	}
	return now.Add(time.Duration(b.rnd.ExpFloat64() * float64(b.cfg.KillEvery)))
}

func (b *broker) done() bool {
	return len(b.ackedIDs) == b.cfg.Messages && b.head == len(b.ready) && len(b.delayed) == 0 &&
		len(b.inflight) == 0 && b.rep.DupsLate >= b.cfg.LateDups
}

func (b *broker) spawn(slot int) error {
	b.gen++
	name := fmt.Sprintf("w%d-%d", slot, b.gen)
	wc := b.target.worker(name)
	wc.Batch = b.cfg.Mode == Redis && slot%2 == 1
	wc.LeaseTTL = b.cfg.LeaseTTL
	wc.Retention = time.Hour
	wc.Prefetch = b.cfg.Prefetch
	wc.Tail = b.cfg.Tail
	js, err := json.Marshal(wc)
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := exec.Command(b.cfg.Command[0], b.cfg.Command[1:]...)
	cmd.Env = append(os.Environ(), WorkerEnv+"="+string(js))
	cmd.ExtraFiles = []*os.File{w}
	p := &proc{slot: slot, name: name, cmd: cmd, stderr: &syncBuffer{}, usable: true}
	cmd.Stderr = p.stderr
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		_ = r.Close()
		_ = w.Close()
		return err
	}
	if err := cmd.Start(); err != nil {
		_ = r.Close()
		_ = w.Close()
		return fmt.Errorf("starting worker %s: %w", name, err)
	}
	_ = w.Close() // the worker holds the only write end: its death is our EOF
	p.started = time.Now()
	b.procs[slot] = p
	b.all = append(b.all, p)
	b.rep.Spawns++
	go func() {
		sc := bufio.NewScanner(r)
		defer r.Close()
		for sc.Scan() {
			select {
			case b.events <- event{p: p, line: sc.Text()}:
			case <-b.quit:
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				return
			}
		}
		e := event{p: p, exit: true, err: cmd.Wait()}
		select {
		case b.events <- e:
		case <-b.quit:
		}
	}()
	return nil
}

func (b *broker) kill(p *proc, afterEffect bool) {
	// Kills keep pace with the acks, at most one ahead, so that they are
	// spread over the whole run rather than spent in its first seconds.
	paced := b.rep.Kills*b.cfg.Messages < b.cfg.MaxKills*len(b.ackedIDs)+b.cfg.Messages
	if p.killed || p.exited || b.rep.Kills >= b.cfg.MaxKills || !paced {
		return
	}
	p.killed, p.usable = true, false
	b.ev.Killed[p.name] = true
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	b.rep.Kills++
	if afterEffect {
		b.rep.KillsAfterEffect++
	}
}

func (b *broker) killRandom(now time.Time) {
	var live []*proc
	for _, p := range b.procs {
		// A worker that has had no time to work is not worth killing.
		if p != nil && p.usable && now.Sub(p.started) > 100*time.Millisecond {
			live = append(live, p)
		}
	}
	if len(live) > 0 {
		b.kill(live[b.rnd.IntN(len(live))], false)
	}
}

func (b *broker) handle(e event) error {
	p := e.p
	if e.exit {
		p.exited, p.usable = true, false
		if !p.killed && !b.stopping {
			return fmt.Errorf("worker %s exited on its own: %v", p.name, e.err)
		}
		if !b.stopping && b.procs[p.slot] == p {
			return b.spawn(p.slot)
		}
		return nil
	}
	f := strings.Fields(e.line)
	bad := func() error { return fmt.Errorf("worker %s sent a bad line %q", p.name, e.line) }
	if len(f) < 2 {
		return bad()
	}
	switch f[0] {
	case "A", "N":
		if len(f) != 2+btoi(f[0] == "N") {
			return bad()
		}
		tag, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return bad()
		}
		d, ok := b.inflight[tag]
		if !ok {
			if f[0] == "A" {
				b.rep.StaleAcks++
			}
			return nil
		}
		delete(b.inflight, tag)
		d.p.inflight--
		if f[0] == "A" {
			b.rep.Acks++
			if !b.acked[d.id] {
				b.acked[d.id] = true
				b.ackedIDs = append(b.ackedIDs, d.id)
			}
			return nil
		}
		delay := 50 * time.Millisecond
		if f[2] == "busy" {
			b.rep.BusyNacks++
			delay = b.cfg.BusyDelay
		} else {
			b.rep.ErrNacks++
		}
		b.delayed = append(b.delayed, delayed{d.id, time.Now().Add(delay)})
	case "E", "C":
		if len(f) != 3 {
			return bad()
		}
		tok, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return bad()
		}
		a := Attempt{ID: f[1], Token: tok, Worker: p.name}
		if f[0] == "C" {
			b.ev.Confirmed[a] = true
			return nil
		}
		b.ev.Effects[a] = true
		if p.usable && b.rnd.Float64() < b.cfg.KillAfterEffect {
			b.kill(p, true)
		}
	case "K":
		if len(f) != 4 {
			return bad()
		}
		b.ev.LeaseTrouble[f[2]] = true
		if f[1] == "not_recorded" {
			b.ev.Unrecorded[f[2]] = true
		}
		b.rep.LeaseEvents[f[1]]++
	default:
		return bad()
	}
	return nil
}

func btoi(v bool) int {
	if v {
		return 1
	}
	return 0
}

func (b *broker) housekeep(now time.Time) {
	for tag, d := range b.inflight {
		if now.After(d.deadline) {
			delete(b.inflight, tag)
			d.p.inflight--
			b.ready = append(b.ready, d.id)
			b.rep.Redeliveries++
		}
	}
	kept := b.delayed[:0]
	for _, d := range b.delayed {
		if now.Before(d.at) {
			kept = append(kept, d)
		} else {
			b.ready = append(b.ready, d.id)
		}
	}
	b.delayed = kept
	// Late duplicates keep pace with the acks, so they are spread over the run.
	for b.rep.DupsLate < b.cfg.LateDups && b.rep.DupsLate*b.cfg.Messages < b.cfg.LateDups*len(b.ackedIDs) {
		b.ready = append(b.ready, b.ackedIDs[b.rnd.IntN(len(b.ackedIDs))])
		b.rep.DupsLate++
	}
	if b.head > 4096 && b.head*2 > len(b.ready) {
		b.ready = append([]string(nil), b.ready[b.head:]...)
		b.head = 0
	}
}

func (b *broker) dispatch() error {
	now := time.Now()
	for _, p := range b.procs {
		if b.head == len(b.ready) {
			return nil
		}
		if p == nil || !p.usable || p.inflight >= b.cfg.Prefetch {
			continue
		}
		var lines []byte
		for p.inflight < b.cfg.Prefetch && b.head < len(b.ready) {
			id := b.ready[b.head]
			b.head++
			b.tag++
			b.inflight[b.tag] = &pending{id: id, p: p, deadline: now.Add(b.cfg.Visibility)}
			p.inflight++
			b.rep.Deliveries++
			lines = fmt.Appendf(lines, "D %d %s\n", b.tag, id)
		}
		// A worker that died since is noticed by its exit event; what was sent
		// to it is redelivered after the visibility timeout, as for any crash.
		_, _ = p.stdin.Write(lines)
	}
	return nil
}

// stop closes the workers' stdin and waits for them to settle and exit.
func (b *broker) stop(ctx context.Context) error {
	b.stopping = true
	for _, p := range b.all {
		if !p.exited {
			p.usable = false
			_ = p.stdin.Close()
		}
	}
	for {
		running := 0
		for _, p := range b.all {
			if !p.exited {
				running++
			}
		}
		if running == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d workers did not exit after their input closed: %w", running, context.Cause(ctx))
		case e := <-b.events:
			if e.exit && !e.p.killed && e.err != nil {
				return fmt.Errorf("worker %s failed: %v", e.p.name, e.err)
			}
			if err := b.handle(e); err != nil {
				return err
			}
		}
	}
}

func (b *broker) killAll() {
	for _, p := range b.all {
		if !p.exited {
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
		}
	}
}

// stderrs returns what the workers wrote on stderr, for a failure message.
func (b *broker) stderrs() string {
	var s strings.Builder
	for _, p := range b.all {
		if out := strings.TrimSpace(p.stderr.String()); out != "" {
			const maxOut = 2000
			if len(out) > maxOut {
				out = "..." + out[len(out)-maxOut:]
			}
			fmt.Fprintf(&s, "\n--- worker %s stderr:\n%s", p.name, out)
		}
	}
	return s.String()
}

// syncBuffer is a bytes.Buffer safe for exec's copying goroutine and a
// reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
