package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// What a store reads of its servers beside first contact's checks
// (redisprobe.go): each master's identity once a second, so that a server
// restarted or replaced by a failover is checked again; a Redis Cluster's
// slots served and its node table, to pass over a master serving no slot
// and to report what is degraded; the INFO and CONFIG answers read into
// findings.

// recheckEvery is how often a store whose server passed its checks reads
// the server's identity again (INFO server's run_id and uptime, and the
// keys INFO keyspace counts; one
// round trip per master), on the path of the next Claim, ClaimBatch or
// Lookup: a server restarted since, perhaps with another configuration or
// without its records, is checked again within it.
const recheckEvery = time.Second

// scriptLosses counts the NOSCRIPT replies every store of the process met:
// a server that lost its scripts was restarted, failed over or flushed, so
// each store reads its servers' identity at its next contact rather than
// at its next scheduled read. Shared, because the first store to meet
// NOSCRIPT loads the scripts again for all.
var scriptLosses atomic.Uint64

// identity is what a master said of itself when a store last read it.
type identity struct {
	runID    string // INFO server's run_id: new on every start
	uptime   int64  // uptime_in_seconds
	keys     int64  // in the client's database, by INFO keyspace; -1 if unknown
	attempts uint64 // the store's Claim attempts then
	at       time.Time
}

// due reports whether the caller, at now, is the one to read the servers'
// identity again: recheckEvery has passed, or a store met NOSCRIPT.
func (p *probe) due(now time.Time) bool {
	if p.blind.Load() {
		return false
	}
	next := p.next.Load()
	if now.UnixNano() < next && scriptLosses.Load() == p.losses.Load() {
		return false
	}
	return p.next.CompareAndSwap(next, now.Add(recheckEvery).UnixNano())
}

// recheck reads each master's identity and reports whether one of them is
// another server than the checks last saw (restarted, or failed over), in
// which case the checks must run again: a fresh process may have another
// configuration (a maxmemory-policy that evicts), and may have come back
// without the records. A server that does not answer is left to the call,
// which reports it; the next read tells whether it restarted meanwhile.
func (s *RedisStore) recheck(ctx context.Context) bool {
	s.probe.losses.Store(scriptLosses.Load())
	// The masters that answered are compared even when one did not: a
	// dead node still in the client's slot map must not hide a promoted
	// replica's new run id (nor a restart) from the checks.
	ids, _ := s.identities(ctx)
	s.probe.mu.Lock()
	defer s.probe.mu.Unlock()
	for addr, id := range ids {
		if before, known := s.probe.seen[addr]; !known || before.runID != id.runID {
			// The checks run again, and tell what changed (notice).
			s.probe.passed.Store(false)
			return true
		}
	}
	return false
}

// notice keeps what a master said of itself when the checks ran, and logs
// a new run id: as an error when the new process came back empty or
// persists nothing (so started empty, or from an old snapshot at best),
// while the one before held keys or this store had claimed some since: the
// records are lost, and their work may be done again; else as a warning.
func (s *RedisStore) notice(ctx context.Context, addr string, id identity, persists bool) {
	id.attempts = s.attempts.Load()
	s.probe.mu.Lock()
	defer s.probe.mu.Unlock()
	if s.probe.seen == nil {
		s.probe.seen = map[string]identity{}
	}
	before, known := s.probe.seen[addr]
	s.probe.seen[addr] = id
	if id.runID == "" {
		// INFO refused: reading it once a second would add a line to
		// ACL LOG each time, and tell nothing.
		s.probe.blind.Store(true)
	}
	if !known || before.runID == id.runID || before.runID == "" || id.runID == "" {
		return // nothing to compare
	}
	attrs := []slog.Attr{slog.String("run_id_before", before.runID), slog.String("run_id", id.runID),
		slog.Int64("uptime_s", id.uptime), slog.Int64("keys_before", before.keys), slog.Int64("keys", id.keys)}
	if addr != "" {
		attrs = append(attrs, slog.String("node", addr))
	}
	what := "restarted"
	if id.uptime > int64(time.Since(before.at)/time.Second)+1 {
		what = "was replaced by another server (a failover?)"
	}
	if (id.keys == 0 || !persists) && (before.keys > 0 || id.attempts > before.attempts) {
		s.log(ctx, slog.LevelError, "idem: Redis "+what+" and came back empty: the records it held are lost, "+
			"and their work may be done again; its checks run again", attrs...)
	} else {
		s.log(ctx, slog.LevelWarn, "idem: Redis "+what+"; its checks run again", attrs...)
	}
}

// identities reads what each master says of itself, in one round trip per
// master. A master that does not answer is left out of the map, and the
// error of one such is returned with what the others said.
func (s *RedisStore) identities(ctx context.Context) (map[string]identity, error) {
	out := map[string]identity{}
	if s.cluster == nil {
		db := 0
		if c, ok := s.c.(*redis.Client); ok {
			db = c.Options().DB
		}
		id, err := readIdentity(ctx, s.c, db)
		if err != nil {
			return out, err
		}
		out[""] = id
		return out, nil
	}
	s.probe.mu.Lock()
	masters := s.probe.masters
	s.probe.mu.Unlock()
	var mu sync.Mutex
	var wg sync.WaitGroup
	var failed error
	for _, c := range masters {
		wg.Go(func() {
			id, err := readIdentity(ctx, c, 0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = err
				return
			}
			out[c.Options().Addr] = id
		})
	}
	wg.Wait()
	if failed == nil && len(masters) > 0 {
		return out, nil
	}
	// A master gone (a failover?), or none known: ask the cluster which
	// are its masters now, reloading its slot map, at most once per
	// recheckEvery.
	err := s.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		id, err := readIdentity(ctx, c, 0)
		if err == nil {
			mu.Lock()
			out[c.Options().Addr] = id
			mu.Unlock()
		}
		return err
	})
	return out, err
}

// readIdentity asks one server for its run id, uptime and the keys of
// database db, in one INFO.
func readIdentity(ctx context.Context, c redis.Cmdable, db int) (identity, error) {
	return identityOf(c.Info(ctx, "server", "keyspace"), db)
}

// identityOf reads a reply to INFO server keyspace. A server that refuses
// INFO (an ACL user without it, where the README's line grants it) has no
// run id to compare: its restarts go unnoticed.
func identityOf(info *redis.StringCmd, db int) (identity, error) {
	id := identity{keys: -1, at: time.Now()}
	text, err := info.Result()
	var refused redis.Error
	switch {
	case errors.As(err, &refused):
		return id, nil
	case err != nil:
		return identity{}, err
	}
	id.runID, _ = infoField(text, "run_id")
	up, _ := infoField(text, "uptime_in_seconds")
	id.uptime, _ = strconv.ParseInt(up, 10, 64)
	id.keys = 0 // an empty database has no line
	if v, ok := infoField(text, "db"+strconv.Itoa(db)); ok {
		keys, _, _ := strings.Cut(strings.TrimPrefix(v, "keys="), ",")
		id.keys, _ = strconv.ParseInt(keys, 10, 64)
	}
	return id, nil
}

// ErrClusterDegraded is reported to the Observer (Op OpCheck) and the
// Logger, at most once a minute per store, when a store's check of a Redis
// Cluster finds a node down, failing or serving no slot while every slot
// is served: the store goes on (no call is refused for it), and an
// operator should bring the node back or remove it (CLUSTER FORGET).
var ErrClusterDegraded = errors.New("idem: a Redis Cluster node is down or serves no slot")

// errNoNodeTable stands for a node table the probe did not read.
var errNoNodeTable = errors.New("idem: CLUSTER NODES not read")

// degradedEvery is how often a store tells of the same degraded cluster.
const degradedEvery = time.Minute

// reportNodes reports the nodes a CLUSTER NODES reply shows failing or
// serving no slot (see ErrClusterDegraded).
func (s *RedisStore) reportNodes(ctx context.Context, nodes string) {
	o := &s.core.o
	if o.Logger == nil && o.Observer == nil {
		return
	}
	found := degradedNodes(nodes)
	if len(found) == 0 {
		return
	}
	now := time.Now()
	last := s.probe.degraded.Load()
	if last != 0 && now.UnixNano()-last < int64(degradedEvery) || !s.probe.degraded.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	err := fmt.Errorf("%w: %s", ErrClusterDegraded, strings.Join(found, "; "))
	s.log(ctx, slog.LevelWarn, "idem: Redis Cluster degraded; every slot is served and the store goes on",
		slog.String("nodes", strings.Join(found, "; ")))
	if o.Observer != nil {
		o.Observer.Observe(ctx, Event{Op: OpCheck, Items: 1, Err: err})
	}
}

// servesSlots reports whether a CLUSTER NODES reply shows the node at addr
// as a master serving slots, or does not know it (then it may).
func servesSlots(nodes, addr string) bool {
	for line := range strings.SplitSeq(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		if a, _, _ := strings.Cut(f[1], "@"); a == addr {
			return len(f) > 8 && slices.Contains(strings.Split(f[2], ","), "master")
		}
	}
	return true
}

// degradedNodes reads a CLUSTER NODES reply and returns, for each node
// failing (flag fail or fail?), without an address (noaddr), or a master
// serving no slot, its address and why.
func degradedNodes(nodes string) []string {
	var out []string
	for line := range strings.SplitSeq(nodes, "\n") {
		// <id> <ip:port@cport[,hostname]> <flags> <master> <ping-sent>
		// <pong-recv> <config-epoch> <link-state> <slot>...
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		flags := strings.Split(f[2], ",")
		var why string
		switch {
		case slices.Contains(flags, "fail"):
			why = "failed"
		case slices.Contains(flags, "fail?"):
			why = "not answering (fail?)"
		case slices.Contains(flags, "noaddr"):
			why = "no address known (noaddr)"
		case slices.Contains(flags, "master") && len(f) == 8:
			why = "a master serving no slot"
		default:
			continue
		}
		role := "replica"
		if slices.Contains(flags, "master") {
			role = "master"
		}
		out = append(out, addr+" ("+role+"): "+why)
	}
	return out
}

// slotsServed refuses a cluster with hash slots no master serves, as
// CLUSTER INFO counts them (cluster_slots_ok: assigned, and to a master
// not failing).
func slotsServed(ctx context.Context, cc *redis.ClusterClient) error {
	info, err := cc.ClusterInfo(ctx).Result()
	if err != nil {
		return fmt.Errorf("idem: reading CLUSTER INFO: %w", err)
	}
	v, ok := infoField(info, "cluster_slots_ok")
	n, err := strconv.Atoi(v)
	if !ok || err != nil {
		return fmt.Errorf("idem: CLUSTER INFO has no cluster_slots_ok: %q", info)
	}
	if n < 16384 {
		return fmt.Errorf("%w: %d of 16384 slots served", ErrSlotsUncovered, n)
	}
	return nil
}

// probeInt reads an integer of probe.lua's reply: TIME's parts are strings.
func probeInt(v any) (int64, bool) {
	switch v := v.(type) {
	case int64:
		return v, true
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil
	}
	return 0, false
}

var errPolicyUnknown = errors.New("neither CONFIG GET nor INFO memory names the policy")

// evictionPolicy reads the maxmemory-policy from the answers to CONFIG GET
// and INFO memory: errPolicyUnknown when the server answers neither with
// it (CONFIG renamed or forbidden, as on managed services), another error
// when it could not be asked at all.
func evictionPolicy(config *redis.MapStringStringCmd, memory *redis.StringCmd) (string, error) {
	policy, err := config.Result()
	var refused redis.Error
	switch {
	case err == nil:
		if p, ok := policy["maxmemory-policy"]; ok {
			return p, nil
		}
	case !errors.As(err, &refused):
		return "", err
	}
	info, err := memory.Result()
	switch {
	case errors.As(err, &refused):
		return "", fmt.Errorf("%w (INFO: %v)", errPolicyUnknown, err)
	case err != nil:
		return "", err
	}
	if p, ok := infoField(info, "maxmemory_policy"); ok {
		return p, nil
	}
	return "", errPolicyUnknown
}

// connectedReplicas reads how many replicas are connected to a master from
// its answer to INFO replication.
func connectedReplicas(replication *redis.StringCmd) (int, error) {
	info, err := replication.Result()
	if err != nil {
		return 0, err
	}
	v, ok := infoField(info, "connected_slaves")
	if !ok {
		return 0, errors.New("INFO replication has no connected_slaves")
	}
	return strconv.Atoi(v)
}

// persistent reports whether a server keeps its data across a restart, from
// its answers to CONFIG GET appendonly and save: AOF on, or at least one
// RDB save point. A server that will not say (CONFIG refused) is taken as
// persistent: the warning is for what is known.
func persistent(appendonly, save *redis.MapStringStringCmd) bool {
	aof, err := appendonly.Result()
	if err != nil || aof["appendonly"] == "yes" {
		return true
	}
	points, err := save.Result()
	return err != nil || strings.TrimSpace(points["save"]) != ""
}

// infoField returns the value of field in an INFO reply.
func infoField(info, field string) (string, bool) {
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v, true
		}
	}
	return "", false
}
