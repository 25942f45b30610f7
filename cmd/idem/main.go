// Command idem shows what idem does and operates its stores.
//
//	idem demo      a fleet of workers on a queue that duplicates, redelivers and crashes
//	idem serve     an example payments API behind the Idempotency-Key middleware
//	idem inspect   one key's record in a store (--quarantined: the quarantined keys)
//	idem resolve   settle a quarantined key: --forget (run it again) or --confirm RESULT
//	idem console   an operator's console in a browser: quarantined keys, a key's record, settling, live counts
//	idem prune     delete expired rows from a SQL store
//	idem schema    the SQL DDL of a store's table, for a migration tool
//	idem bench     idem beside its alternatives on real Redis, Redis Cluster and Postgres
//	idem check     certify a Redis (or a SQL database) for idem: the first contact's checks, the conformance suite, latency and CPU
//
// Every command answers --help, listing the flags it takes. A store flag
// takes an address in any of its forms (--redis: host:port or a redis://,
// rediss:// or unix:// URL; --sqlite: a path or a file: URI), and each
// store has one environment variable (IDEM_REDIS_ADDR,
// IDEM_REDIS_CLUSTER_ADDRS, IDEM_POSTGRES_DSN, IDEM_MYSQL_DSN,
// IDEM_SQLITE_FILE).
//
// The build tags idem_nopostgres, idem_nomysql and idem_nosqlite leave the
// Postgres, MySQL and SQLite drivers out: a third less to compile on a first build, for a demo
// on the embedded Redis.
//
// Exit status: 0 success; 1 the command ran
// and found a problem (a demo whose ledger breaks the guarantees, a key not
// found); 2 a usage error or a store that cannot be reached.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Exit statuses. Operators script around them, so they are part of the
// command's contract.
const (
	exitOK      = 0
	exitFailed  = 1 // the command ran and found a problem
	exitUsage   = 2 // bad flags, unknown command, unreachable store
	programName = "idem"
)

func init() {
	// go-redis logs its retries to stderr on its own; the commands report
	// what matters as one line, so its log would only garble that line.
	redis.SetLogger(quietLogger{})
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func main() {
	// go-redis logs each failed dial of its pool on its own (8 lines for one
	// call to a Redis that is down, each retry's). Every failure they
	// describe reaches the command as the error of the call that met it,
	// which the command reports once, naming the store: the lines only
	// repeat it.
	redis.SetLogger(quietRedis{})
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// quietRedis is go-redis's logger in the command: it drops the lines.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// run is the whole command: it parses args, runs the command and returns the
// exit status. It reads connection settings from the process environment.
func run(args []string, stdout, stderr io.Writer) int {
	return (&cli{stdout: stdout, stderr: stderr, getenv: os.Getenv}).run(args)
}

// cli carries what a command talks to, so tests can give it buffers and an
// environment of their own instead of the process's.
type cli struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	// demoFault, when set, breaks the demo's ledger after the run and
	// before the check: the tests' way to see a broken guarantee fail the
	// demo. nil outside tests.
	demoFault func(*ledger)
}

// command is one subcommand: its one-line summary and its entry point.
type command struct {
	summary string
	run     func(c *cli, args []string) int
}

var commands = map[string]command{}

// commandOrder is the order of the commands in the usage text.
var commandOrder = []string{"demo", "serve", "inspect", "resolve", "console", "prune", "schema", "bench", "check"}

func init() {
	// Filled here rather than in the declaration: the commands' run funcs
	// print usage, which reads commands (an initialization cycle otherwise).
	commands["demo"] = command{"run workers on a queue that duplicates, redelivers and crashes; check the ledger", (*cli).demo}
	commands["serve"] = command{"serve an example payments API behind the Idempotency-Key middleware", (*cli).serve}
	commands["inspect"] = command{"show one key's record and attempts (--http: an HTTP request's; --quarantined: list)", (*cli).inspect}
	commands["resolve"] = command{"settle a quarantined key: --forget (run it again) or --confirm RESULT (done)", (*cli).resolve}
	commands["console"] = command{"serve an operator's console: quarantined keys, settling, live counts (127.0.0.1, a token)", (*cli).console}
	commands["prune"] = command{"delete expired rows from a SQL store (run it on a schedule)", (*cli).prune}
	commands["schema"] = command{"print the SQL DDL of a store's table, for a migration tool", (*cli).schema}
	commands["bench"] = command{"measure idem beside its alternatives on real Redis, Redis Cluster and Postgres", (*cli).bench}
	commands["check"] = command{"certify a Redis or SQL database for idem: first contact's checks, conformance suite, latency", (*cli).check}
}

func (c *cli) run(args []string) int {
	if len(args) == 0 {
		c.usage(c.stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help", "help":
		c.usage(c.stdout)
		return exitOK
	}
	cmd, ok := commands[name]
	if !ok {
		return c.usageError("", fmt.Errorf("unknown command %q", name))
	}
	return cmd.run(c, args[1:])
}

func (c *cli) usage(w io.Writer) {
	fmt.Fprintf(w, "idem makes work delivered twice happen once.\n\nUsage: idem COMMAND [flags]\n\nCommands:\n")
	for _, n := range commandOrder {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "\nRun `idem COMMAND --help` for a command's flags.\n"+
		"Exit status: 0 success, 1 the command found a problem, 2 usage error or unreachable store.\n")
}

// usageError prints err as one line on stderr and returns exitUsage.
func (c *cli) usageError(cmd string, err error) int {
	name := programName
	if cmd != "" {
		name += " " + cmd
	}
	fmt.Fprintf(c.stderr, "%s: %v (see `%s --help`)\n", name, err, name)
	return exitUsage
}

// fail prints err as one line on stderr and returns status.
func (c *cli) fail(cmd string, status int, err error) int {
	fmt.Fprintf(c.stderr, "idem %s: %s\n", cmd, oneLine(err.Error()))
	return status
}

// oneLine keeps an error to one line: a driver's multi-line message would
// break the one-line-on-stderr contract that scripts rely on.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// parse parses args into fs. Flags and positional arguments may be
// interleaved (idem inspect KEY --json); everything after "--" is
// positional. It returns done=true with the exit status when the command
// should stop: after --help (usage on stdout, 0) or a bad flag (one line on
// stderr, 2).
func (c *cli) parse(fs *flag.FlagSet, args []string, synopsis, about string) (positional []string, done bool, status int) {
	fs.SetOutput(io.Discard) // the flag package's own message is two lines and the usage
	fs.Usage = func() {}
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(c.stdout, "Usage: idem %s %s\n\n%s\n\nFlags:\n", fs.Name(), synopsis, about)
			fs.SetOutput(c.stdout)
			fs.PrintDefaults()
			return nil, true, exitOK
		}
		if err != nil {
			if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
				if why, ok := refusedFlags[fs.Name()][name]; ok {
					err = fmt.Errorf("--%s: %s", name, why)
				} else {
					err = fmt.Errorf("unknown flag --%s", name)
				}
			}
			return nil, true, c.usageError(fs.Name(), err)
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), false, exitOK
		}
		if len(rest) == 0 {
			return positional, false, exitOK
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// refusedFlags says, by command, why it has no flag that other commands
// have, for the user who gives it anyway.
var refusedFlags = map[string]map[string]string{
	"prune": {
		"redis":   "prune is for SQL stores (--postgres, --mysql, --sqlite): Redis expires its keys itself",
		"cluster": "prune is for SQL stores (--postgres, --mysql, --sqlite): Redis expires its keys itself",
		"prefix":  "prune is for SQL stores (--postgres, --mysql, --sqlite): Redis expires its keys itself",
	},
	"bench": {
		"sqlite": "bench measures Postgres (--postgres), not SQLite",
		"table":  "bench makes tables of its own",
		"prefix": "bench makes keys of its own",
	},
}

// noArgs answers positional arguments that a command does not take.
func (c *cli) noArgs(cmd string, positional []string) int {
	return c.usageError(cmd, fmt.Errorf("unexpected argument %q", positional[0]))
}
