package idem

import (
	"fmt"
	"strconv"
)

// Keys are byte strings: any non-empty value up to MaxKeyBytes, NUL bytes and
// invalid UTF-8 included, compared byte for byte.

// checkKey rejects what no store may hold, before any I/O.
func (o *Options) checkKey(key string) error {
	if o.MaxKeyBytes == 0 {
		// Only a store that no constructor made has unresolved options.
		return errZeroStore
	}
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if len(key) > o.MaxKeyBytes {
		return fmt.Errorf("%w: key of %d bytes exceeds MaxKeyBytes %d", ErrInvalidKey, len(key), o.MaxKeyBytes)
	}
	return nil
}

// keyName names a key in error messages by its keyed hash ("key#…"):
// errors end up in logs, and keys may carry personal data. With RevealKeys
// it is the key itself, quoted.
func (o *Options) keyName(key string) string {
	if o.RevealKeys {
		return "key " + strconv.Quote(key)
	}
	return "key#" + o.KeyHasher.Hash(key)
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
