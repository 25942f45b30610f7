package idem

// The Redis record's format, on the client's side: the scripts' answers and
// how they are read into Claims and Records, and the parts of a record the
// client builds before the call (scripts/record.lua describes the format).

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"time"
)

// The scripts' answers (scripts/*.lua, named there as here).
const (
	// replyDamaged answers any operation, or batch item, on a record the
	// scripts cannot decode.
	replyDamaged = "X"

	// claim.lua's states, the first element of an array reply.
	replyClaimed = "C" // a new lease after a forgotten claim
	replyAgain   = "A" // the lease this same attempt was given before
	replyTaken   = "T" // a new lease, the take-over of a lapsed claim
	replyDone    = "D" // confirmed
	replyByOp    = "R" // confirmed by an operator (Record.Resolved)
	replyHeld    = "P" // held by a live claim
	replyQuar    = "Q" // quarantined
	replyLapsed  = "L" // a lapsed claim (lookup.lua asked for one: Inspect)

	// confirm.lua's answers.
	confirmHeld    = 1 // the lease was held
	confirmLate    = 2 // the lease had been lost; recorded all the same
	confirmRepeat  = 3 // already confirmed by this lease
	confirmNotKept = 4 // already confirmed by another lease
)

// damaged reports the scripts' answer for a damaged record.
func damaged(v any) bool {
	s, ok := v.(string)
	return ok && s == replyDamaged
}

// errDamaged is op's error on key's damaged record.
func (s *RedisStore) errDamaged(op, key string) error {
	return fmt.Errorf("%w: %s of %s", ErrDamaged, op, s.core.KeyName(key))
}

// parseClaim turns claim.lua's reply into a Claim, and a record made with
// another fingerprint into ErrFingerprintMismatch with the Claim.
func (s *RedisStore) parseClaim(key string, fingerprint []byte, start time.Time, v any) (Claim, error) {
	if damaged(v) {
		return Claim{}, s.errDamaged("claim", key)
	}
	if t, ok := v.(string); ok {
		// The common case, a new lease, is answered with its token alone.
		tok, err := strconv.ParseInt(t, 10, 64)
		if err != nil {
			return Claim{}, s.badReply("claim", key, v)
		}
		return s.claimed(key, tok, s.core.o.LeaseTTL, fingerprint, start), nil
	}
	a, ok := v.([]any)
	if !ok || len(a) < 2 {
		return Claim{}, s.badReply("claim", key, v)
	}
	st, _ := a[0].(string)
	tok, ok := token(a[1])
	if !ok {
		return Claim{}, s.badReply("claim", key, v)
	}
	switch st {
	case replyTaken:
		return s.parseTakeOver(key, tok, fingerprint, start, a)
	case replyClaimed, replyAgain:
		ttl := s.core.o.LeaseTTL
		if st == replyAgain {
			var p int64
			if len(a) == 3 {
				p, _ = a[2].(int64)
			}
			if p <= 0 {
				return Claim{}, s.badReply("claim", key, v)
			}
			ttl = time.Duration(p) * time.Millisecond
		}
		return s.claimed(key, tok, ttl, fingerprint, start), nil
	case replyDone, replyByOp, replyHeld, replyQuar:
		rec, err := s.parseRecord(key, start, a)
		if err != nil {
			return Claim{}, err
		}
		if rec.Quarantined {
			return Claim{Record: rec}, s.core.Quarantined(rec)
		}
		c := Claim{Outcome: InProgress, Record: rec}
		if rec.Confirmed {
			c.Outcome = Duplicate
		}
		return c, s.core.FingerprintMismatch(c, key, fingerprint)
	}
	return Claim{}, s.badReply("claim", key, v)
}

// claimed is the Claim of a new lease on key; left is what remains of it.
func (s *RedisStore) claimed(key string, tok int64, left time.Duration, fingerprint []byte, start time.Time) Claim {
	return Claim{Outcome: Claimed,
		Lease: s.core.Lease(key, tok, s.core.o.LeaseTTL, start.Add(left), bytes.Clone(fingerprint))}
}

// parseTakeOver reads claim.lua's {'T', token, n, cp, ptoken, powner[,
// ended]}: a new lease that took over the lapsed claim of ptoken's
// attempt, which its holder gave up saying why when ended is there.
func (s *RedisStore) parseTakeOver(key string, tok int64, fingerprint []byte, start time.Time, a []any) (Claim, error) {
	if len(a) != 6 && len(a) != 7 {
		return Claim{}, s.badReply("claim", key, a)
	}
	n, ok1 := a[2].(int64)
	cp, ok2 := a[3].(string)
	prior, ok3 := attempt(a[4], a[5])
	ok4 := true
	if len(a) == 7 && ok3 {
		prior.Ended, ok4 = a[6].(string)
	}
	if !ok1 || !ok2 || !ok3 || !ok4 || n <= 0 {
		return Claim{}, s.badReply("claim", key, a)
	}
	c := s.claimed(key, tok, s.core.o.LeaseTTL, fingerprint, start)
	c.TakeOver, c.Prior, c.TakeOvers = true, prior, int(n)
	if cp != "" {
		c.Checkpoint = []byte(cp)
	}
	return c, nil
}

// attempt reads an earlier attempt as the scripts send it: its token (the
// store's clock in microseconds when it was claimed) and owner.
func attempt(tv, ov any) (*Attempt, bool) {
	tok, ok1 := token(tv)
	owner, ok2 := ov.(string)
	if !ok1 || !ok2 {
		return nil, false
	}
	return &Attempt{Owner: owner, Token: tok, Claimed: time.UnixMicro(tok)}, true
}

// parseRecord reads the replies that claim.lua and lookup.lua share:
// {'D', token, pttl, fingerprint, result} (an operator's confirmation
// 'R', the same fields), or for a live claim ('P') or a
// quarantined key ('Q') {state, token, pttl, fingerprint, owner, n, cp},
// when n > 0 the prior attempt's token and owner, and last, when the
// claim's holder gave it up saying why, the reason.
func (s *RedisStore) parseRecord(key string, start time.Time, a []any) (*Record, error) {
	if len(a) < 5 {
		return nil, s.badReply("record", key, a)
	}
	st, _ := a[0].(string)
	tok, ok1 := token(a[1])
	pttl, ok2 := a[2].(int64)
	fp, ok3 := a[3].(string)
	last, ok4 := a[4].(string)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return nil, s.badReply("record", key, a)
	}
	done := st == replyDone || st == replyByOp
	rec := &Record{Key: key, Confirmed: done, Resolved: st == replyByOp, Token: tok, Fingerprint: []byte(fp)}
	switch {
	case done && len(a) == 5:
		rec.Result = []byte(last)
	case (st == replyHeld || st == replyQuar) && len(a) >= 7 && len(a) <= 10:
		rec.Owner, rec.Quarantined = last, st == replyQuar
		n, ok1 := a[5].(int64)
		cp, ok2 := a[6].(string)
		fields := 7 // and 2 more for a prior attempt
		if n > 0 {
			fields = 9
		}
		ok3 := true
		if len(a) == fields+1 {
			rec.Ended, ok3 = a[fields].(string)
		}
		if !ok1 || !ok2 || !ok3 || n < 0 || len(a) < fields || len(a) > fields+1 {
			return nil, s.badReply("record", key, a)
		}
		rec.TakeOvers = int(n)
		if cp != "" {
			rec.Checkpoint = []byte(cp)
		}
		if n > 0 {
			var ok bool
			if rec.Prior, ok = attempt(a[7], a[8]); !ok {
				return nil, s.badReply("record", key, a)
			}
		}
	default:
		return nil, s.badReply("record", key, a)
	}
	// A key without a TTL (-1) was persisted by someone else: it never
	// expires, which the zero Expires says.
	if pttl >= 0 {
		rec.Expires = start.Add(time.Duration(pttl) * time.Millisecond)
	}
	return rec, nil
}

// token parses a token as the scripts send it: a decimal string.
func token(v any) (int64, bool) {
	s, ok := v.(string)
	if !ok {
		return 0, false
	}
	t, err := strconv.ParseInt(s, 10, 64)
	return t, err == nil
}

func (s *RedisStore) badReply(op, key string, v any) error {
	return fmt.Errorf("idem: %s of %s: unexpected reply from Redis (%T)", op, s.core.KeyName(key), v)
}

// sharedArgs is how many of claim.lua's and confirm.lua's first arguments
// their batch forms take once for all their keys.
const sharedArgs = 2

// confirmArgs are confirm.lua's ARGV for l: the retention and the claim's
// keep, which a batch shares, then l's own (see scriptCall).
func (s *RedisStore) confirmArgs(l *Lease, result []byte) []any {
	// Both values in one allocation; the held prefix is capped so that
	// nothing appended to it could overwrite the confirmation. 48 bytes
	// hold the fixed parts of both ("1C", "1D", today's 16-digit tokens,
	// the separators and two field lengths); more only costs a
	// reallocation.
	b := make([]byte, 0, 48+len(l.Owner)+len(l.Fingerprint)+len(result))
	b = appendHeld(b, l)
	n := len(b)
	if s.longConfirmations || len(l.Fingerprint) > 0 || len(result) > 0 || l.Token < 1e15 || l.Token >= 1e16 {
		b = appendDone(b, l, result)
	} else {
		// The short form, the token alone (16 digits, as record.lua reads
		// it): Redis keeps a value that reads as a number in its object,
		// without a string of its own.
		b = strconv.AppendInt(b, l.Token, 10)
	}
	return []any{s.retentionMs, s.retentionMs, b[:n:n], b[n:]}
}

// confirmed interprets confirm.lua's answer v, logging a late confirm;
// another lease's confirmation kept is ErrAlreadyConfirmed.
func (s *RedisStore) confirmed(ctx context.Context, l *Lease, v any) (late bool, err error) {
	if damaged(v) {
		return false, s.errDamaged("confirm", l.Key)
	}
	n, _ := v.(int64)
	switch n {
	case confirmHeld, confirmRepeat:
		return false, nil
	case confirmLate:
		s.core.LogLate(ctx, l)
		return true, nil
	case confirmNotKept:
		s.core.LogLate(ctx, l)
		return true, s.core.AlreadyConfirmed(l)
	}
	return false, s.badReply("confirm", l.Key, v)
}

// The parts of a Redis record (format in scripts/record.lua) that the client
// builds: it knows them before the call, and a byte copied here is a byte
// Redis, which every client shares, does not have to assemble.

// claimTail is a new claim's value after "2C<token>:":
// <#owner>:<owner><#attempt>:<attempt><keep>:0:0:<fingerprint> (no
// take-overs, no checkpoint).
func claimTail(owner string, attempt []byte, keep string, fingerprint []byte) []byte {
	b := make([]byte, 0, len(owner)+len(attempt)+len(keep)+len(fingerprint)+12)
	b = appendField(b, owner)
	b = strconv.AppendInt(b, int64(len(attempt)), 10)
	b = append(b, ':')
	b = append(b, attempt...)
	b = append(b, keep...)
	b = append(b, ":0:0:"...)
	return append(b, fingerprint...)
}

// heldPrefix is how the claim of a lease begins:
// 2C<token>:<#owner>:<owner>.
func heldPrefix(l *Lease) []byte {
	return appendHeld(make([]byte, 0, 24+len(l.Owner)), l)
}

// appendHeld appends heldPrefix(l) to b.
func appendHeld(b []byte, l *Lease) []byte {
	b = append(b, "2C"...)
	b = strconv.AppendInt(b, l.Token, 10)
	b = append(b, ':')
	return appendField(b, l.Owner)
}

// appendDone appends a confirmation:
// 1D<token>:<#fingerprint>:<fingerprint><result>.
func appendDone(b []byte, l *Lease, result []byte) []byte {
	b = append(b, "1D"...)
	b = strconv.AppendInt(b, l.Token, 10)
	b = append(b, ':')
	b = appendField(b, string(l.Fingerprint))
	return append(b, result...)
}

// appendField appends s length-prefixed: <#s>:<s>.
func appendField(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}
