package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// Check runs `redis-cli --cluster check` from the first node and returns
// an error holding its output unless it found nothing wrong: every slot
// covered, every node agreeing on the slot map, no slot open for a move.
// The node it starts from must be running.
func (c *ClusterServers) Check(ctx context.Context) error {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, cli, "--cluster", "check", c.Nodes[0].Addr).CombinedOutput()
	if err == nil && (strings.Contains(string(out), "[ERR]") || strings.Contains(string(out), "[WARNING]")) {
		err = fmt.Errorf("problems reported")
	}
	if err != nil {
		return fmt.Errorf("redis-cli --cluster check %s: %w\n%s", c.Nodes[0].Addr, err, out)
	}
	return nil
}

// LogTail returns the last n lines of the server's log, to tell why a
// cluster did not settle.
func (s *RedisServer) LogTail(n int) string {
	i := slices.Index(s.args, "--logfile")
	if i < 0 || i+1 >= len(s.args) {
		return ""
	}
	b, err := os.ReadFile(s.args[i+1])
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
