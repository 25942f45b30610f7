package idem

// The Redis key of a record is the store's Prefix, then the user's key
// escaped and wrapped in braces: "idem:{order-42}". The braces make the
// escaped key the Redis Cluster hash tag, so a key's slot never depends on
// the prefix, and the escaping keeps the user's braces out of the tag.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// RecordKey returns the name of the Redis key that holds key's record, as
// the store writes it: its Prefix, then key escaped inside a hash tag
// ("idem:{order-42}"), for an operator's redis-cli or a tool that plants a
// record. It does no I/O.
func (s *RedisStore) RecordKey(key string) string { return s.redisKey(key) }

// redisKey returns the Redis key name holding key's record.
func (s *RedisStore) redisKey(key string) string {
	// One allocation, sized exactly (an escaped byte takes three): String
	// does not copy the builder's bytes.
	n := escapes(key)
	var b strings.Builder
	b.Grow(len(s.prefix) + len(key) + 2*n + 2)
	b.WriteString(s.prefix)
	b.WriteByte('{')
	if n == 0 {
		b.WriteString(key)
	} else {
		var esc [3]byte
		for i := 0; i < len(key); i++ {
			b.Write(appendEscapedKey(esc[:0], key[i:i+1]))
		}
	}
	b.WriteByte('}')
	return b.String()
}

// appendEscapedKey appends key to dst in the escaped form used inside Redis
// key names: bytes 0x21-0x7E other than '%', '{' and '}' stand for
// themselves; every other byte is '%' followed by two upper-case hex digits.
//
// The encoding is injective (decoding is unambiguous because '%' is always
// escaped) and its output never contains '{' or '}', so when it is wrapped in
// braces the hash tag Redis Cluster computes is exactly the encoded key,
// whatever the user key contains. Printable keys such as UUIDs are unchanged,
// which keeps records readable with redis-cli and small in memory.
func appendEscapedKey(dst []byte, key string) []byte {
	const digits = "0123456789ABCDEF"
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !mustEscape(c) {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, '%', digits[c>>4], digits[c&0xF])
	}
	return dst
}

// escapes counts the bytes of key that appendEscapedKey escapes.
func escapes(key string) int {
	n := 0
	for i := 0; i < len(key); i++ {
		if mustEscape(key[i]) {
			n++
		}
	}
	return n
}

func mustEscape(c byte) bool {
	return c <= 0x20 || c >= 0x7F || c == '%' || c == '{' || c == '}'
}

// userKey returns the user's key of a Redis key name that redisKey made,
// and false for any other name.
func (s *RedisStore) userKey(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, s.prefix+"{")
	if !ok {
		return "", false
	}
	rest, ok = strings.CutSuffix(rest, "}")
	if !ok {
		return "", false
	}
	b := make([]byte, 0, len(rest))
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if c != '%' {
			if mustEscape(c) {
				return "", false
			}
			b = append(b, c)
			continue
		}
		if i+2 >= len(rest) {
			return "", false
		}
		v, err := strconv.ParseUint(rest[i+1:i+3], 16, 8)
		if err != nil || rest[i+1:i+3] != strings.ToUpper(rest[i+1:i+3]) {
			return "", false
		}
		b = append(b, byte(v))
		i += 2
	}
	return string(b), true
}

// escapeGlob escapes the glob characters of s for SCAN's MATCH.
func escapeGlob(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// fieldHash returns the hash that may keep key's confirmation as a field
// in form f (RedisOptions.FieldHashes; scripts/record.lua, the field
// form), or "" when f is nil: the store keeps none. For a confirm (write),
// also "" before f's fields may be written. The hash is in the record
// key's Cluster hash slot, so that one script reaches both: its hash tag
// is the slot's tag (slotTags), and a slot's records are spread over f.n
// hashes by a second hash of the key. Its name, the Prefix, the tag in
// braces and 'f' with the hash's number, is no record key's, which ends at
// its brace.
func (s *RedisStore) fieldHash(f *fieldForm, key string, write bool) string {
	if f == nil || write && time.Now().Before(f.writeFrom) {
		return ""
	}
	// The escaped key on the stack, and one allocation for the name.
	var buf [128]byte
	esc := appendEscapedKey(buf[:0], key)
	var slot uint16
	if len(esc) > 0 {
		slot = crc16(esc) % clusterSlots
	} else {
		slot = crc16(s.prefix+"{}") % clusterSlots // "{}" is no hash tag
	}
	tag := slotTags()[slot]
	var b strings.Builder
	b.Grow(len(s.prefix) + len(tag) + 3 + 5)
	b.WriteString(s.prefix)
	b.WriteByte('{')
	b.WriteString(tag)
	b.WriteString("}f")
	if f.n > 1 {
		// FNV-1a, 32 bits.
		h := uint32(2166136261)
		for _, c := range esc {
			h = (h ^ uint32(c)) * 16777619
		}
		var num [10]byte
		b.Write(strconv.AppendUint(num[:0], uint64(h%uint32(f.n)), 10))
	}
	return b.String()
}

// fieldForm is how a store's Prefix keeps confirmations as fields, as the
// form's key says (see readForm).
type fieldForm struct {
	n int // hashes a slot
	// writeFrom is when confirmations may be written as fields: a while
	// after the form's key was written, so that every store sharing the
	// Prefix has read it first (formGrace).
	writeFrom time.Time
}

// formGrace is how long after the form's key is written confirmations are
// first written as fields. A store reads the key at first contact and then
// never goes by a reading older than formStale (rereadForm): so every store
// has read the key before the first field, with 3s to spare for a call
// queued meanwhile and the clocks of the processes. A store takes it when
// made (RedisStore.formGrace).
var formGrace = 5 * time.Second

// formEvery is how often a store reads the form's key again; formStale,
// how old a reading may be when a new one fails, before the store's
// claims and lookups fail with it rather than go by an old form.
const (
	formEvery = time.Second
	formStale = 2 * time.Second
)

// formKey is the key that says that the Prefix's confirmations are kept
// as fields, and in how many hashes a slot: "<n>:<unix ms of its
// writing>". No record's (those have braces after the Prefix).
func (s *RedisStore) formKey() string { return s.prefix + "fields" }

// ErrFieldHashes is a finding of first contact: RedisOptions.FieldHashes
// is not what the Prefix's form key says (another process keeps
// confirmations in another number of hashes), or that key is not one idem
// wrote. The store would look for confirmations where they are not.
var ErrFieldHashes = errors.New("idem: FieldHashes does not match the Prefix's field form")

// readForm reads the form's key and sets the form the store reads and
// writes by: the key's, whatever the store's own FieldHashes, so that a
// store without it still finds the confirmations others keep as fields.
// A store with FieldHashes writes the key where there is none. A key that
// says another number than the store's FieldHashes is ErrFieldHashes: the
// two would look for a key's confirmation in different hashes.
func (s *RedisStore) readForm(ctx context.Context) error {
	key := s.formKey()
	v, err := s.c.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		if s.fieldHashes == 0 {
			s.form.Store(nil)
			return nil
		}
		v = strconv.Itoa(s.fieldHashes) + ":" + strconv.FormatInt(time.Now().UnixMilli(), 10)
		var set bool
		if set, err = s.c.SetNX(ctx, key, v, 0).Result(); err == nil && !set {
			v, err = s.c.Get(ctx, key).Result()
		}
	}
	if err != nil {
		return fmt.Errorf("idem: reading %s, the key that says how confirmations are kept: %w", key, err)
	}
	ns, ms, ok := strings.Cut(v, ":")
	n, err1 := strconv.Atoi(ns)
	at, err2 := strconv.ParseInt(ms, 10, 64)
	if !ok || err1 != nil || err2 != nil || n < 1 || n > maxFieldHashes {
		return fmt.Errorf("%w: %s holds %q, not <hashes>:<unix ms>", ErrFieldHashes, key, v)
	}
	if s.fieldHashes > 0 && n != s.fieldHashes {
		return fmt.Errorf("%w: FieldHashes is %d, and %s says the Prefix's confirmations are kept in %d hash(es) a slot; set FieldHashes to %d",
			ErrFieldHashes, s.fieldHashes, key, n, n)
	}
	if f := s.form.Load(); f == nil || f.n != n {
		s.form.Store(&fieldForm{n: n, writeFrom: time.UnixMilli(at).Add(s.formGrace)})
	}
	return nil
}

// rereadForm reads the form's key again, on the path of a claim or a
// lookup, when formEvery has passed since the last reading: a store made
// before another process turned the field form on finds it within
// formEvery. One reading at a time; the calls that find one under way wait
// for it, so that none goes by the form it replaces. A failed reading
// keeps the form it had for formStale since the last good one, and then
// fails the call: a store must not claim by a form it cannot know is
// still the Prefix's. ErrFieldHashes fails it at once.
func (s *RedisStore) rereadForm(ctx context.Context, now time.Time) error {
	if now.UnixNano()-s.formRead.Load() < int64(formEvery) {
		return nil
	}
	select {
	case s.formGate <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.formGate }()
	last := s.formRead.Load()
	if time.Now().UnixNano()-last < int64(formEvery) {
		return nil // read meanwhile by the call this one waited for
	}
	err := s.readForm(ctx)
	switch {
	case err == nil:
		s.formRead.Store(time.Now().UnixNano())
		return nil
	case errors.Is(err, ErrFieldHashes) || time.Now().UnixNano()-last >= int64(formStale):
		return err
	}
	return nil
}

// clusterSlots is how many hash slots Redis Cluster has.
const clusterSlots = 16384

// slotTags holds, for each hash slot, the shortest base-36 number whose
// name hashes to it: a hash tag that puts a key in that slot.
var slotTags = sync.OnceValue(func() *[clusterSlots]string {
	var tags [clusterSlots]string
	for n, found := uint64(0), 0; found < clusterSlots; n++ {
		t := strconv.FormatUint(n, 36)
		if slot := crc16(t) % clusterSlots; tags[slot] == "" {
			tags[slot] = t
			found++
		}
	}
	return &tags
})

// crc16 is the CRC-16/XMODEM that Redis Cluster hashes keys with, a
// byte at a time (crcTable).
func crc16[T string | []byte](s T) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^s[i]]
	}
	return crc
}

// crcTable is crc16's step for each byte: polynomial 0x1021.
var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()
