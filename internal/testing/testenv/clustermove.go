package testenv

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// AddMaster starts a node with the cluster's arguments, joins it as a
// master that owns no slot (`redis-cli --cluster add-node`), and waits
// until every node knows it. It fails t (t.Fatalf: call it from the test's
// goroutine) when the node does not join. Not concurrently with MoveSlot.
func (c *ClusterServers) AddMaster() *RedisServer {
	c.t.Helper()
	s := c.startNode()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "redis-cli", "--cluster", "add-node", s.Addr, c.Nodes[0].Addr).CombinedOutput()
	if err != nil {
		c.t.Fatalf("redis-cli --cluster add-node %s %s: %v\n%s", s.Addr, c.Nodes[0].Addr, err, out)
	}
	c.Nodes = append(c.Nodes, s)
	want := "cluster_known_nodes:" + strconv.Itoa(len(c.Nodes)) + "\r"
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range c.Nodes {
		cl := n.Client(c.t)
		for {
			info, _ := cl.ClusterInfo(ctx).Result()
			if strings.Contains(info, want) && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if ctx.Err() != nil {
				c.t.Fatalf("cluster node %s does not know the new master %s after 30s:\n%s", n.Addr, s.Addr, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return s
}

// ID returns the node's cluster ID (CLUSTER MYID).
func (s *RedisServer) ID(ctx context.Context) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer func() { _ = c.Close() }()
	return c.Do(ctx, "cluster", "myid").Text()
}

// MoveSlot moves slot from master from to master to by the protocol
// `redis-cli --cluster reshard` follows: to imports it, from migrates it,
// its keys go over with MIGRATE (in groups of half the slot's keys, at
// most 100), and every master is told the new owner. While the slot is
// open, a call on a key still on from is served there, and any other
// key's call is answered ASK (go-redis follows it to to). whileOpen, if
// not nil, runs once with the slot still open, when half of its keys have
// moved (at once, for an empty slot), and is told how many have and how
// many are still on from: both are at least 1 when the slot held 2 keys or
// more (left counts the keys from held when the slot opened). Its error
// stops the move, the slot left open, and is returned.
// Unlike redis-cli, MoveSlot never replaces a key with MIGRATE REPLACE: a
// key found on both nodes is an error naming it and both its values.
//
// Safe from any goroutine; it reports nothing to t. Not to be called while
// AddMaster runs, which adds to c.Nodes.
func (c *ClusterServers) MoveSlot(ctx context.Context, slot int, from, to *RedisServer, whileOpen func(moved, left int64) error) error {
	src := redis.NewClient(&redis.Options{Addr: from.Addr, MaxRetries: -1})
	defer func() { _ = src.Close() }()
	dst := redis.NewClient(&redis.Options{Addr: to.Addr, MaxRetries: -1})
	defer func() { _ = dst.Close() }()
	srcID, err := src.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		return fmt.Errorf("CLUSTER MYID on %s: %w", from.Addr, err)
	}
	dstID, err := dst.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		return fmt.Errorf("CLUSTER MYID on %s: %w", to.Addr, err)
	}
	if err := dst.Do(ctx, "cluster", "setslot", slot, "importing", srcID).Err(); err != nil {
		return fmt.Errorf("slot %d: SETSLOT IMPORTING on %s: %w", slot, to.Addr, err)
	}
	if err := src.Do(ctx, "cluster", "setslot", slot, "migrating", dstID).Err(); err != nil {
		return fmt.Errorf("slot %d: SETSLOT MIGRATING on %s: %w", slot, from.Addr, err)
	}
	total, err := src.ClusterCountKeysInSlot(ctx, slot).Result()
	if err != nil {
		return fmt.Errorf("slot %d: CLUSTER COUNTKEYSINSLOT on %s: %w", slot, from.Addr, err)
	}
	group := min(max(total/2, 1), 100)
	host, port, _ := net.SplitHostPort(to.Addr)
	var moved int64
	opened := whileOpen == nil
	for {
		if !opened && moved >= total/2 {
			opened = true
			if err := whileOpen(moved, total-moved); err != nil {
				return err
			}
		}
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, int(group)).Result()
		if err != nil {
			return fmt.Errorf("slot %d: CLUSTER GETKEYSINSLOT on %s: %w", slot, from.Addr, err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("slot %d: MIGRATE of %d keys %s → %s: %w%s", slot, len(keys), from.Addr, to.Addr, err,
				onBoth(ctx, src, dst, keys))
		}
		moved += int64(len(keys))
	}
	if !opened {
		if err := whileOpen(moved, 0); err != nil {
			return err
		}
	}
	// The new owner first, so that it serves the slot before the old one
	// redirects there with MOVED; then every other master.
	if err := dst.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err(); err != nil {
		return fmt.Errorf("slot %d: SETSLOT NODE on %s: %w", slot, to.Addr, err)
	}
	if err := src.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err(); err != nil {
		return fmt.Errorf("slot %d: SETSLOT NODE on %s: %w", slot, from.Addr, err)
	}
	for _, n := range c.Nodes {
		if n == from || n == to {
			continue
		}
		nc := redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})
		role, err := nc.Do(ctx, "role").Slice()
		if err == nil && len(role) > 0 && role[0] == "master" {
			err = nc.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err()
		}
		_ = nc.Close()
		if err != nil {
			return fmt.Errorf("slot %d: SETSLOT NODE on %s: %w", slot, n.Addr, err)
		}
	}
	return nil
}

// onBoth describes the keys that src and dst both hold, with their values
// and remaining lives on each, for the error of a MIGRATE that found one
// on dst (BUSYKEY): what made the second copy tells how it came to be.
func onBoth(ctx context.Context, src, dst *redis.Client, keys []string) string {
	var b strings.Builder
	for _, k := range keys {
		pipe := dst.Pipeline()
		pipe.Do(ctx, "asking")
		get := pipe.Get(ctx, k)
		pipe.Do(ctx, "asking")
		ttl := pipe.PTTL(ctx, k)
		_, _ = pipe.Exec(ctx)
		if get.Err() != nil {
			continue
		}
		fmt.Fprintf(&b, "\n\tkey %q: on %s %q (pttl %v), on %s %q (pttl %v)", k,
			src.Options().Addr, src.Get(ctx, k).Val(), src.PTTL(ctx, k).Val(),
			dst.Options().Addr, get.Val(), ttl.Val())
	}
	return b.String()
}
