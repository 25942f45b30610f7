package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/textproto"
	"os"
	"strconv"
	"strings"

	"github.com/idemgo/idem"
)

const resolveAbout = `Settles a quarantined key: one whose work crashed its worker more times in a
row than the store's MaxTakeOvers, and which no one runs until an operator
decides (idem.Resolver.Resolve). Look first: idem inspect KEY shows the
attempts and the last checkpoint; idem inspect --quarantined lists them.
KEY is the store key, as idem inspect --quarantined lists it.

--forget removes the record: the next delivery or call runs the work again,
as new (no take-over, the count starts again). Use it once the cause is
fixed, when the effect did not happen. With --force it clears any key but
one in flight: a confirmed record (its result is dropped) or a damaged
one (no front door can read it) too; the work then runs again.

To record the key as done (the effect did happen), give the result its
front door replays to every duplicate for the store's retention:
  --do JSON          a key of idem.Do: the JSON of the value, which Do
                     decodes into its result type ('{"ID":"rcpt-9"}');
                     refused unless it is JSON. A Do whose result type is
                     string or []byte takes it as it is: --confirm.
  --http-status CODE a key of the HTTP middleware (h2<len>:<scope><len>:<client
                     key>): the response its retries get, with --header
                     'Name: value' (repeated; only the headers the
                     middleware replays by default) and --body TEXT or
                     --body-file PATH. A status the middleware does not
                     record (a 5xx, a 409) is refused.
  --confirm RESULT   the bytes as they are (--confirm-hex HEX for bytes that
                     are not text): a consumer wrapper's key (it replays no
                     result: --confirm ''), the raw API's, or a Do of a
                     string or []byte.
  --rpc-type NAME --confirm-hex HEX
                     a key of the gRPC or Connect interceptors (g1...): the
                     response message every retry gets, by its full type
                     name (acme.orders.v1.Order) and its wire encoding in
                     hex (protoc --encode=NAME file.proto < msg.txt | xxd -p);
                     in Go, the module's Resolution builds the same.

A key that is not quarantined is left as it is, and the command exits 1
(--forget --force clears it). --hex reads KEY as hex, for keys that are
not text.`

// headerFlags collects repeated --header 'Name: value' flags.
type headerFlags http.Header

func (h headerFlags) String() string { return "" }

func (h headerFlags) Set(s string) error {
	name, value, ok := strings.Cut(s, ":")
	if !ok || strings.TrimSpace(name) == "" {
		return fmt.Errorf("%q is not 'Name: value'", s)
	}
	k := textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(name))
	h[k] = append(h[k], strings.TrimSpace(value))
	return nil
}

func (c *cli) resolve(args []string) int {
	fs := flag.NewFlagSet("resolve", flag.ContinueOnError)
	var sf storeFlags
	sf.register(fs, c.getenv, kindsAll)
	forget := fs.Bool("forget", false, "remove the record: the work runs again")
	force := fs.Bool("force", false, "with --forget: clear any record but a live claim (a confirmed or damaged one too)")
	confirm := fs.String("confirm", "", "record the key as done with `RESULT`, byte for byte")
	confirmHex := fs.String("confirm-hex", "", "record the key as done with the hex-encoded `RESULT`")
	doJSON := fs.String("do", "", "record a key of idem.Do as done with the `JSON` of its value")
	status := fs.Int("http-status", 0, "record a key of the HTTP middleware as done with a response of this `CODE`")
	header := headerFlags{}
	fs.Var(header, "header", "with --http-status: a replayed `'Name: value'` header (repeat for more)")
	body := fs.String("body", "", "with --http-status: the response body `TEXT`")
	bodyFile := fs.String("body-file", "", "with --http-status: read the response body from `PATH`")
	rpcType := fs.String("rpc-type", "", "with --confirm-hex: settle a key of the gRPC or Connect interceptors with a response message of this full type `NAME` (its wire encoding in --confirm-hex)")
	asHex := fs.Bool("hex", false, "KEY is hex-encoded")
	pos, done, st := c.parse(fs, args, "[store flags] --forget [--force] | --do JSON | --http-status CODE [--header H]... [--body TEXT | --body-file PATH] | --confirm RESULT | --confirm-hex HEX [--rpc-type NAME] KEY",
		resolveAbout+"\n\n"+envHelp(kindsAll))
	if done {
		return st
	}
	if len(pos) != 1 {
		return c.usageError("resolve", fmt.Errorf("want exactly one KEY, got %d arguments", len(pos)))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	key := pos[0]
	if *asHex {
		k, err := hex.DecodeString(key)
		if err != nil {
			return c.usageError("resolve", fmt.Errorf("--hex: %w", err))
		}
		key = string(k)
	}
	in := settleInput{Forget: *forget, Force: *force}
	var form settleForm
	switch n := btoi(set["forget"]) + btoi(set["confirm"]) + btoi(set["confirm-hex"]) + btoi(set["do"]) + btoi(set["http-status"]); {
	case n != 1:
		return c.usageError("resolve", errors.New("give one of --forget, --do JSON, --http-status CODE, --confirm RESULT or --confirm-hex HEX"))
	case set["forget"] && !*forget:
		return c.usageError("resolve", errors.New("--forget=false settles nothing; give --forget or a result"))
	case set["force"] && !set["forget"]:
		return c.usageError("resolve", errors.New("--force goes with --forget: it clears a key, it records no result"))
	case !set["http-status"] && (len(header) > 0 || set["body"] || set["body-file"]):
		return c.usageError("resolve", errors.New("--header, --body and --body-file go with --http-status"))
	case set["rpc-type"] && !set["confirm-hex"]:
		return c.usageError("resolve", errors.New("--rpc-type goes with --confirm-hex: the response message's wire encoding"))
	case set["rpc-type"]:
		b, err := hex.DecodeString(*confirmHex)
		if err != nil {
			return c.usageError("resolve", fmt.Errorf("--confirm-hex: %w", err))
		}
		form, in.Value, in.Type = formRPC, b, *rpcType
	case set["confirm"]:
		form, in.Value = formPlain, []byte(*confirm)
	case set["confirm-hex"]:
		b, err := hex.DecodeString(*confirmHex)
		if err != nil {
			return c.usageError("resolve", fmt.Errorf("--confirm-hex: %w", err))
		}
		form, in.Value = formPlain, b
	case set["do"]:
		form, in.Value = formDo, []byte(*doJSON)
	case set["http-status"]:
		form, in.Status, in.Header, in.Body = formHTTP, *status, http.Header(header), []byte(*body)
		if set["body"] && set["body-file"] {
			return c.usageError("resolve", errors.New("give --body or --body-file, not both"))
		}
		if set["body-file"] {
			b, err := os.ReadFile(*bodyFile)
			if err != nil {
				return c.usageError("resolve", fmt.Errorf("--body-file: %w", err))
			}
			in.Body = b
		}
	}
	if !in.Forget {
		if err := checkKeyForm(key, form); err != nil {
			return c.usageError("resolve", err)
		}
	}
	r, err := settleResolution(form, in)
	if err != nil {
		return c.usageError("resolve", err)
	}
	if err := c.chooseStore("resolve", fs, &sf); err != nil {
		return c.usageError("resolve", err)
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
	held := ""
	if r.Force {
		held = heldDescription(ctx, s, key)
	}
	if err := rs.Resolve(ctx, key, r); err != nil {
		switch {
		case r.Force && errors.Is(err, idem.ErrInProgress):
			return c.fail("resolve", exitFailed, fmt.Errorf("key %s is held by a live claim in %s: left as it is; its holder is at work (idem inspect %s shows when its lease ends)",
				quoteKey(key), b.desc, quoteKey(key)))
		case r.Force && errors.Is(err, idem.ErrNotFound):
			return c.fail("resolve", exitFailed, fmt.Errorf("key %s has no record in %s: nothing to clear", quoteKey(key), b.desc))
		case errors.Is(err, idem.ErrNotFound):
			return c.fail("resolve", exitFailed, fmt.Errorf("key %s is not quarantined in %s: left as it is (idem inspect %s shows its record; idem resolve --forget --force %s clears any record but a live claim, and the work runs again)",
				quoteKey(key), b.desc, quoteKey(key), quoteKey(key)))
		}
		return c.fail("resolve", exitFailed, err)
	}
	switch {
	case r.Confirm:
		fmt.Fprintf(c.stdout, "key %s recorded as done (%d bytes of result, %s form) in %s: its duplicates are answered with it\n",
			quoteKey(key), len(r.Result), form, b.desc)
	case r.Force:
		fmt.Fprintf(c.stdout, "key %s cleared in %s (it held %s): the next delivery or call runs the work again\n", quoteKey(key), b.desc, held)
	default:
		fmt.Fprintf(c.stdout, "key %s forgotten in %s: the next delivery runs the work as new\n", quoteKey(key), b.desc)
	}
	return exitOK
}

// heldDescription says what key's record is before a forced forget
// clears it, for the command's report.
func heldDescription(ctx context.Context, s idem.Store, key string) string {
	rec, err := s.Lookup(ctx, key)
	switch {
	case errors.Is(err, idem.ErrDamaged):
		return "a damaged record"
	case errors.Is(err, idem.ErrNotFound):
		return "a lapsed claim"
	case err != nil:
		return "a record that could not be read"
	case rec.Quarantined:
		return "a quarantined key"
	case rec.Confirmed && rec.Resolved:
		return "an operator's confirmation of " + strconv.Itoa(len(rec.Result)) + " bytes"
	case rec.Confirmed:
		return "a confirmation of " + strconv.Itoa(len(rec.Result)) + " bytes"
	}
	return "a live claim"
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
