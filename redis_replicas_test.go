package idem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/internal/testenv"
)

// --- 9. Waiting for replicas (RedisOptions.WaitReplicas) -------------------

// eventLog is an Observer that keeps every Event.
type eventLog struct {
	mu     sync.Mutex
	events []Event
}

func (l *eventLog) Observe(_ context.Context, e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// last returns the last event of op.
func (l *eventLog) last(op Op) (Event, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.events) - 1; i >= 0; i-- {
		if l.events[i].Op == op {
			return l.events[i], true
		}
	}
	return Event{}, false
}

// TestRedisWaitReplicas runs on the Sentinel set's master, which has one
// replica: waiting for it succeeds; waiting for two cannot, and says so with
// ErrNotReplicated while the confirmation stays written. Either way a
// Confirm is one round trip, and a ConfirmBatch too.
func TestRedisWaitReplicas(t *testing.T) {
	c := testenv.Sentinel(t)
	ctx := context.Background()
	for _, auto := range []bool{false, true} {
		for _, tt := range []struct {
			replicas int
			timeout  time.Duration
			want     error
		}{
			{1, time.Second, nil},
			{2, 50 * time.Millisecond, ErrNotReplicated},
		} {
			name := map[bool]string{false: "alone", true: "autopipeline"}[auto]
			t.Run(fmt.Sprintf("%s/replicas=%d", name, tt.replicas), func(t *testing.T) {
				events := &eventLog{}
				s := newTestRedisStore(t, c, RedisOptions{
					Observer:     events,
					WaitReplicas: tt.replicas, WaitTimeout: tt.timeout, AutoPipeline: auto,
				})
				h := &tripCounter{}
				c.AddHook(h)
				loadScripts(t, c)

				keys := uuidKeys(11)
				leases := claimAllOK(t, s, keys, nil)
				h.take()
				err := s.Confirm(ctx, leases[0], []byte("r"))
				if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
					t.Errorf("Confirm(%q) with WaitReplicas %d = %v; want %v", keys[0], tt.replicas, err, tt.want)
				}
				if trips, sent := h.take(); trips != 1 {
					t.Errorf("Confirm with WaitReplicas cost %d round trips (%v); want 1", trips, sent)
				} else if sent[0] != "pipeline of 2 evalsha,wait" && sent[0] != "pipeline of 2 wait,evalsha" {
					t.Errorf("Confirm with WaitReplicas sent %q; want the script and WAIT in one pipeline", sent[0])
				}
				if e, ok := events.last(OpConfirm); !ok || !errors.Is(e.Err, tt.want) || (tt.want == nil) != (e.Err == nil) {
					t.Errorf("Observer saw Confirm event %+v; want Err %v", e, tt.want)
				}

				err = s.ConfirmBatch(ctx, leases[1:], nil)
				if tt.want == nil && err != nil {
					t.Errorf("ConfirmBatch with WaitReplicas %d = %v; want nil", tt.replicas, err)
				}
				if tt.want != nil {
					var be *BatchError
					if !errors.As(err, &be) || len(be.Errs) != len(leases)-1 {
						t.Fatalf("ConfirmBatch with WaitReplicas %d = %v; want a BatchError of %d items", tt.replicas, err, len(leases)-1)
					}
					for i, e := range be.Errs {
						if !errors.Is(e, tt.want) {
							t.Errorf("ConfirmBatch item %d = %v; want %v", i, e, tt.want)
						}
					}
				}
				if trips, sent := h.take(); trips != 1 {
					t.Errorf("ConfirmBatch with WaitReplicas cost %d round trips (%v); want 1", trips, sent)
				}
				// Replicated or not, the confirmation is on the master.
				checkAllDuplicate(t, s, keys)
			})
		}
	}
}

// TestRedisWaitReplicasCluster: the test cluster's masters have no
// replicas, so a wait for one times out with ErrNotReplicated — after the
// confirm and its WAIT went to the master owning each key, one pipeline per
// master.
func TestRedisWaitReplicasCluster(t *testing.T) {
	c := testenv.Cluster(t)
	ctx := context.Background()
	for _, auto := range []bool{false, true} {
		s := newTestRedisStore(t, c, RedisOptions{WaitReplicas: 1, WaitTimeout: 20 * time.Millisecond, AutoPipeline: auto})
		loadScripts(t, c)
		keys := uuidKeys(30)
		leases := claimAllOK(t, s, keys, nil)
		trips, masters := hookMasters(t, c)
		var wg sync.WaitGroup
		for _, l := range leases[:10] {
			wg.Go(func() {
				if err := s.Confirm(ctx, l, nil); !errors.Is(err, ErrNotReplicated) {
					t.Errorf("Confirm(%q) on a master without replicas = %v; want %v", l.Key, err, ErrNotReplicated)
				}
			})
		}
		wg.Wait()
		trips.take()
		err := s.ConfirmBatch(ctx, leases[10:], nil)
		if !errors.Is(err, ErrNotReplicated) {
			t.Errorf("ConfirmBatch on masters without replicas = %v; want %v", err, ErrNotReplicated)
		}
		got := trips.take()
		if len(got) != masters {
			t.Errorf("ConfirmBatch of 20 keys reached %d masters (%v); want all %d", len(got), got, masters)
		}
		for node, n := range got {
			if n != 1 {
				t.Errorf("ConfirmBatch of 20 keys cost %d round trips to %s (%v); want 1 per master", n, node, got)
			}
		}
		checkAllDuplicate(t, s, keys)
	}
}
