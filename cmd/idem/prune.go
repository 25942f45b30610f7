package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/idemgo/idem"
)

const pruneAbout = `Deletes the rows of a SQL store whose lease or retention ran out, judged by
the database's clock (sqlstore.Store.PurgeExpired: statements of at most 1000
rows, each its own transaction), and prints how many it deleted. Nothing on
idem's hot path deletes rows: run this on a schedule, e.g. hourly from cron
or a Kubernetes CronJob. An interrupt (Ctrl-C) or --timeout stops it between
statements; what was deleted stays deleted and is counted. Redis needs no
pruning: its keys expire by themselves.`

// pruneProgressEvery is how often prune reports that it is still working.
var pruneProgressEvery = 2 * time.Second

func (c *cli) prune(args []string) int {
	fs := flag.NewFlagSet("prune", flag.ContinueOnError)
	var sf storeFlags
	sf.register(fs, c.getenv, kindsSQL)
	timeout := fs.Duration("timeout", 0, "stop after this long (0: no limit)")
	pos, done, st := c.parse(fs, args, "--postgres DSN | --mysql DSN | --sqlite FILE [--table NAME]", pruneAbout+"\n\n"+envHelp(kindsSQL))
	if done {
		return st
	}
	if len(pos) > 0 {
		return c.noArgs("prune", pos)
	}
	if err := c.chooseStore("prune", fs, &sf); err != nil {
		return c.usageError("prune", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	b, err := sf.open(ctx, false, true)
	if err != nil {
		return c.fail("prune", exitUsage, err)
	}
	defer b.close()
	s, err := b.sqlStore(idem.Options{})
	if err != nil {
		return c.usageError("prune", err)
	}
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	fmt.Fprintf(c.stdout, "pruning expired rows of table %s in %s\n", b.table, b.desc)
	start := time.Now()
	// PurgeExpired reports only its total, so progress is the time spent,
	// told now and then so that a long prune does not look hung.
	stopProgress := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(pruneProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-t.C:
				fmt.Fprintf(c.stdout, "still pruning, %v\n", time.Since(start).Round(time.Second))
			}
		}
	})
	n, err := s.PurgeExpired(ctx)
	close(stopProgress)
	wg.Wait()
	fmt.Fprintf(c.stdout, "deleted %d expired rows in %v\n", n, roundDuration(time.Since(start)))
	if err != nil {
		return c.fail("prune", exitFailed, err)
	}
	return exitOK
}

// roundDuration rounds d for people: to the microsecond below a second, to
// the millisecond above.
func roundDuration(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Microsecond)
	}
	return d.Round(time.Millisecond)
}
