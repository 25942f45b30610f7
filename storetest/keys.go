package storetest

import (
	"fmt"
	"strings"

	"github.com/idemgo/idem"
)

func init() {
	register(
		check{"Keys/Distinct", keysDistinct},
		check{"Keys/Invalid", keysInvalid},
	)
}

// trickyKeys are keys that a careless encoding would merge or break: NUL
// bytes, hash-tag braces, separators, escapes, invalid UTF-8, the longest
// key allowed.
func trickyKeys(s *suite) []string {
	p := s.key("")
	return []string{
		p + "a\x00b", p + "a\x00c", p + "a", p + "a\x00",
		p + "{x}", p + "{x}}", p + "}{", p + "{", p + "}",
		p + "a:b", p + "a%3Ab", p + "%", p + "%25", p + "a b", p + "a\nb",
		p + "\xff\xfe", p + "\xc3\x28", p + "é", p + "e\u0301",
		strings.Repeat("k", idem.DefaultMaxKeyBytes),
		strings.Repeat("k", idem.DefaultMaxKeyBytes-1) + "\x00",
	}
}

func keysDistinct(s *suite) {
	st := s.open("w1")
	keys := trickyKeys(s)
	// The 1024-byte keys are shared by every check run: make them this
	// check's own without changing their length.
	n := len(keys)
	tag := fmt.Sprintf("%08x", uint32(len(s.Name())*2654435761))
	keys[n-2] = tag + keys[n-2][len(tag):]
	keys[n-1] = tag + keys[n-1][len(tag):]
	leases := make([]*idem.Lease, len(keys))
	for i, k := range keys {
		leases[i] = s.claim(st, k, fmt.Sprintf("fp%d", i), idem.Claimed).Lease
	}
	for i := range keys {
		s.confirm(st, leases[i], fmt.Sprintf("result%d", i))
	}
	for i, k := range keys {
		d := s.claim(st, k, "", idem.Duplicate)
		checkConfirmation(s, d.Record, leases[i], fmt.Sprintf("result%d", i))
		r, err := st.Lookup(ctx(s), k)
		if err != nil {
			s.Fatalf("Lookup(%q) = %v; want its confirmation", k, err)
		}
		// Two different keys never share a record, whatever they contain.
		checkConfirmation(s, r, leases[i], fmt.Sprintf("result%d", i))
		if r.Key != k {
			s.Errorf("Lookup(%q).Key = %q; want the key byte for byte", k, r.Key)
		}
	}
}

func keysInvalid(s *suite) {
	st := s.open("w1")
	small := s.openWith(idem.Options{Worker: "w1", MaxKeyBytes: 16})
	cases := []struct {
		st  idem.Store
		key string
	}{
		{st, ""},
		{st, strings.Repeat("k", idem.DefaultMaxKeyBytes+1)},
		{small, strings.Repeat("k", 17)},
	}
	for _, c := range cases {
		if _, err := c.st.Claim(ctx(s), c.key, nil); !isErr(err, idem.ErrInvalidKey) {
			s.Errorf("Claim of a %d-byte key = %v; want ErrInvalidKey", len(c.key), err)
		}
		if _, err := c.st.Lookup(ctx(s), c.key); !isErr(err, idem.ErrInvalidKey) {
			s.Errorf("Lookup of a %d-byte key = %v; want ErrInvalidKey", len(c.key), err)
		}
		l := s.forge(c.st, c.key, 1, "w1")
		if err := c.st.Confirm(ctx(s), l, nil); !isErr(err, idem.ErrInvalidKey) {
			s.Errorf("Confirm of a lease with a %d-byte key = %v; want ErrInvalidKey", len(c.key), err)
		}
		if b, ok := c.st.(idem.Batcher); ok {
			_, err := b.ClaimBatch(ctx(s), []string{s.key("fine"), c.key}, nil)
			if !isErr(err, idem.ErrInvalidKey) {
				s.Errorf("ClaimBatch with a %d-byte key = %v; want ErrInvalidKey", len(c.key), err)
			}
			// Bad input fails the whole batch before any I/O.
			if _, err := st.Lookup(ctx(s), s.key("fine")); !isErr(err, idem.ErrNotFound) {
				s.Errorf("after a rejected ClaimBatch, Lookup of its valid key = %v; want ErrNotFound", err)
			}
		}
	}
	s.claim(small, strings.Repeat("k", 16)+"", "", idem.Claimed)
	if err := st.Renew(ctx(s), nil); err == nil {
		s.Errorf("Renew(nil) = nil; want an error")
	}
	if _, err := st.Claim(ctx(s), s.key("fp"), make([]byte, idem.MaxFingerprintBytes+1)); !isErr(err, idem.ErrTooLarge) {
		s.Errorf("Claim with a %d-byte fingerprint = %v; want ErrTooLarge", idem.MaxFingerprintBytes+1, err)
	}
}
