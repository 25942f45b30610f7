package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"

	"github.com/idemgo/idem"
)

const resolveAbout = `Settles a quarantined key: one whose work crashed its worker more times in a
row than the store's MaxTakeOvers, and which no one runs until an operator
decides (idem.Resolver.Resolve). Look first: idem inspect KEY shows the
attempts and the last checkpoint; idem inspect --quarantined lists them.

--forget removes the record: the next delivery or call runs the work again,
as new (no take-over, the count starts again). Use it once the cause is
fixed, when the effect did not happen.

--confirm RESULT records the key as done with RESULT, replayed to every
duplicate for the store's retention: use it when the effect did happen.
RESULT is stored byte for byte (--confirm-hex for bytes that are not text):
the consumer wrappers record an empty result (--confirm ''); a key of
idem.Do needs Do's encoding of its result, and a key of the HTTP middleware
its recorded response, so forget those unless you hold that encoding.

A key that is not quarantined is left as it is, and the command exits 1.
--hex reads KEY as hex, for keys that are not text.`

func (c *cli) resolve(args []string) int {
	fs := flag.NewFlagSet("resolve", flag.ContinueOnError)
	var sf storeFlags
	sf.register(fs, c.getenv, kindsAll)
	forget := fs.Bool("forget", false, "remove the record: the work runs again")
	confirm := fs.String("confirm", "", "record the key as done with `RESULT` (as given)")
	confirmHex := fs.String("confirm-hex", "", "record the key as done with the hex-encoded `RESULT`")
	asHex := fs.Bool("hex", false, "KEY is hex-encoded")
	pos, done, st := c.parse(fs, args, "[store flags] --forget | --confirm RESULT | --confirm-hex HEX KEY", resolveAbout+"\n\n"+envHelp(kindsAll))
	if done {
		return st
	}
	if len(pos) != 1 {
		return c.usageError("resolve", fmt.Errorf("want exactly one KEY, got %d arguments", len(pos)))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var r idem.Resolution
	switch n := btoi(set["forget"]) + btoi(set["confirm"]) + btoi(set["confirm-hex"]); {
	case n != 1:
		return c.usageError("resolve", errors.New("give one of --forget, --confirm RESULT or --confirm-hex HEX"))
	case set["forget"] && !*forget:
		return c.usageError("resolve", errors.New("--forget=false settles nothing; give --forget or --confirm RESULT"))
	case set["confirm"]:
		r = idem.Resolution{Confirm: true, Result: []byte(*confirm)}
	case set["confirm-hex"]:
		b, err := hex.DecodeString(*confirmHex)
		if err != nil {
			return c.usageError("resolve", fmt.Errorf("--confirm-hex: %w", err))
		}
		r = idem.Resolution{Confirm: true, Result: b}
	}
	if err := c.chooseStore("resolve", fs, &sf); err != nil {
		return c.usageError("resolve", err)
	}
	key := pos[0]
	if *asHex {
		k, err := hex.DecodeString(key)
		if err != nil {
			return c.usageError("resolve", fmt.Errorf("--hex: %w", err))
		}
		key = string(k)
	}
	ctx := context.Background()
	b, err := sf.open(ctx, false, true)
	if err != nil {
		return c.fail("resolve", exitUsage, err)
	}
	defer b.close()
	s, err := b.store(idem.Options{})
	if err != nil {
		return c.usageError("resolve", err)
	}
	rs, ok := s.(idem.Resolver)
	if !ok {
		return c.fail("resolve", exitUsage, fmt.Errorf("the store of %s (%T) cannot settle keys", b.desc, s))
	}
	if err := rs.Resolve(ctx, key, r); err != nil {
		if errors.Is(err, idem.ErrNotFound) {
			return c.fail("resolve", exitFailed, fmt.Errorf("key %s is not quarantined in %s: left as it is (idem inspect %s shows its record)",
				quoteKey(key), b.desc, quoteKey(key)))
		}
		return c.fail("resolve", exitFailed, err)
	}
	if r.Confirm {
		fmt.Fprintf(c.stdout, "key %s recorded as done (%d bytes of result) in %s: its duplicates are answered with it\n", quoteKey(key), len(r.Result), b.desc)
	} else {
		fmt.Fprintf(c.stdout, "key %s forgotten in %s: the next delivery runs the work as new\n", quoteKey(key), b.desc)
	}
	return exitOK
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
