package reliability_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testing/testenv"
)

// Faults of the Redis server itself: its script cache flushed under a
// batch workload, and the server killed and restarted.

// noScripts counts the NOSCRIPT answers a client met (each a call the
// store sent again after loading its script), and the SCRIPT LOADs it sent
// after the moment in since (UnixNano; 0: none counted): a store opened
// after a restart loads its scripts on first contact and meets no
// NOSCRIPT.
type noScripts struct {
	n, loads, since atomic.Int64
}

func (h *noScripts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *noScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.count(cmd)
		return err
	}
}

func (h *noScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return err
	}
}

func (h *noScripts) count(cmd redis.Cmder) {
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		h.n.Add(1)
	}
	if since := h.since.Load(); since != 0 && time.Now().UnixNano() > since &&
		cmd.Name() == "script" && len(cmd.Args()) > 1 && cmd.Args()[1] == "load" {
		h.loads.Add(1)
	}
}

// TestFaultsRedisScriptFlush, on each server of the matrix, flushes the script cache again and again
// while workers claim and confirm in batches (ClaimBatch, ConfirmBatch:
// pipelines, which go-redis cannot send again by itself). The store must
// recover on its own: no error, every message confirmed once.
func TestFaultsRedisScriptFlush(t *testing.T) {
	t.Parallel()
	testenv.EachServer(t, faultsRedisScriptFlush)
}

func faultsRedisScriptFlush(t *testing.T, kind testenv.Server) {
	srv := kind.Start(t, "--appendonly", "no")
	ctl := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = ctl.Close() })
	const messages, workers, batch = 400, 4, 16
	keys := make([]string, messages)
	for i := range keys {
		keys[i] = "flush:" + strconv.Itoa(i)
	}
	queue := make(chan string, 2*messages)
	var remaining atomic.Int64
	remaining.Store(2 * messages)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	go func() {
		// Over about a second, so that many flushes meet batches.
		for i, k := range keys {
			if !sleepCtx(ctx, time.Until(start.Add(time.Duration(i)*time.Second/messages))) {
				return
			}
			queue <- k
			queue <- k
		}
	}()

	var (
		flushes   atomic.Int64
		errs      atomic.Int64
		batches   atomic.Int64
		mu        sync.Mutex
		effects   = make(map[string]int)
		evals     noScripts
		done      = make(chan struct{})
		closeOnce sync.Once
	)
	finish := func() { closeOnce.Do(func() { close(done) }) }
	go func() {
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			if err := ctl.ScriptFlush(ctx).Err(); err == nil {
				flushes.Add(1)
			}
		}
	}()
	var wg sync.WaitGroup
	for i := range workers {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = c.Close() })
		c.AddHook(&evals)
		s, err := idem.NewRedisStore(c, idem.RedisOptions{LeaseTTL: time.Second,
			Worker: "flush-worker-" + strconv.Itoa(i)})
		if err != nil {
			t.Fatalf("NewRedisStore: %v", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			requeue := func(k string) { time.AfterFunc(10*time.Millisecond, func() { queue <- k }) }
			doneOne := func() {
				if remaining.Add(-1) == 0 {
					finish()
				}
			}
			for {
				var ks []string
				select {
				case <-done:
					return
				case <-ctx.Done():
					return
				case k := <-queue:
					ks = append(ks, k)
				}
			more:
				for len(ks) < batch {
					select {
					case k := <-queue:
						ks = append(ks, k)
					default:
						break more
					}
				}
				batches.Add(1)
				cs, err := s.ClaimBatch(ctx, ks, nil)
				if err != nil {
					errs.Add(1)
					t.Errorf("ClaimBatch during SCRIPT FLUSHes: %v", err)
					for _, k := range ks {
						requeue(k)
					}
					continue
				}
				var leases []*idem.Lease
				for j, c := range cs {
					switch c.Outcome {
					case idem.Duplicate:
						doneOne()
					case idem.InProgress:
						requeue(ks[j])
					case idem.Claimed:
						mu.Lock()
						effects[ks[j]]++
						mu.Unlock()
						leases = append(leases, c.Lease)
					}
				}
				if len(leases) == 0 {
					continue
				}
				if err := s.ConfirmBatch(ctx, leases, nil); err != nil {
					errs.Add(1)
					t.Errorf("ConfirmBatch during SCRIPT FLUSHes: %v", err)
					for _, l := range leases {
						requeue(l.Key)
					}
					continue
				}
				for range leases {
					doneOne()
				}
			}
		}()
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Errorf("after 30s, %d of %d deliveries were still not done", remaining.Load(), 2*messages)
	}
	finish()
	wg.Wait()

	check, err := idem.NewRedisStore(ctl, idem.RedisOptions{})
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	doubles := 0
	for _, k := range keys {
		if rec, err := check.Lookup(context.Background(), k); err != nil || !rec.Confirmed {
			t.Errorf("message %q lost: Lookup = %+v, %v; want a confirmed record", k, rec, err)
		}
		if effects[k] != 1 {
			doubles++
			t.Errorf("message %q took effect %d times; want once (no call failed)", k, effects[k])
		}
	}
	t.Logf("SCRIPT FLUSH: messages %d, batches %d, flushes %d, NOSCRIPT answers recovered from %d, errors seen %d, double effects %d, %v",
		messages, batches.Load(), flushes.Load(), evals.n.Load(), errs.Load(), doubles, time.Since(start).Round(time.Millisecond))
	if flushes.Load() < 3 || evals.n.Load() == 0 {
		t.Errorf("%d flushes, %d NOSCRIPT answers; want the workload to have met flushes and recovered from them",
			flushes.Load(), evals.n.Load())
	}
}

// TestFaultsRedisRestart, on each server of the matrix, kills the server (SIGKILL) twice during the workload
// and starts it again on the same port and data directory. With
// appendonly yes and appendfsync always, Redis writes each command to its
// AOF before it replies, so every Confirm that returned nil before a kill
// must still be there after the restart; the store must recover by itself
// (new connections, a script cache to fill again).
func TestFaultsRedisRestart(t *testing.T) {
	t.Parallel()
	testenv.EachServer(t, faultsRedisRestart)
}

func faultsRedisRestart(t *testing.T, kind testenv.Server) {
	srv := kind.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = direct.Close() })
	ds, err := idem.NewRedisStore(direct, idem.RedisOptions{})
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	var evals noScripts
	open := func(i int, o idem.Options) idem.Store {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1,
			DialTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond})
		t.Cleanup(func() { _ = c.Close() })
		c.AddHook(&evals)
		s, err := idem.NewRedisStore(c, idem.RedisOptionsFrom(o))
		if err != nil {
			t.Fatalf("NewRedisStore: %v", err)
		}
		return s
	}
	var restarts, checked, survived atomic.Int64
	w := workload{messages: 150, workers: 4, lease: 500 * time.Millisecond, opTimeout: 400 * time.Millisecond,
		crashRate: 0.02, failRate: 0.05, spread: 3 * time.Second, limit: 30 * time.Second}
	r := runWorkload(t, w, open, ds, func(ctx context.Context, led *ledger) {
		for range 2 {
			if !sleepCtx(ctx, 500*time.Millisecond) {
				return
			}
			killed := time.Now()
			evals.since.CompareAndSwap(0, killed.UnixNano())
			srv.Kill()
			confirmed := led.confirmedBefore(killed)
			time.Sleep(150 * time.Millisecond)
			srv.Start()
			restarts.Add(1)
			for _, k := range confirmed {
				checked.Add(1)
				// Not ctx: the check must finish even if the workload has.
				lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				rec, err := ds.Lookup(lctx, k)
				cancel()
				if err != nil || !rec.Confirmed {
					t.Errorf("message %q was confirmed before the kill; after the restart Lookup = %+v, %v", k, rec, err)
					continue
				}
				survived.Add(1)
			}
		}
	})
	t.Logf("restart: %v; restarts %d, confirmed records checked after restarts %d, survived %d, NOSCRIPT answers recovered from %d",
		r, restarts.Load(), checked.Load(), survived.Load(), evals.n.Load()+evals.loads.Load())
	// NOSCRIPT answers prove the workload reached the restarted servers (a
	// new server has no scripts); errors are not required, since the
	// client's own retries may hide a short outage.
	if restarts.Load() != 2 || checked.Load() == 0 || evals.n.Load()+evals.loads.Load() == 0 {
		t.Errorf("restarts %d, records checked %d, errors %d, NOSCRIPT answers %d, SCRIPT LOADs after the first kill %d; want 2 restarts that the workload reached and recovered from",
			restarts.Load(), checked.Load(), r.errors(), evals.n.Load(), evals.loads.Load())
	}
}
