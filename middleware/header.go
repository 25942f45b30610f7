package middleware

import (
	"errors"
	"net/http"
	"strings"
)

// Why a key was refused; each answers 400 with TypeKeyInvalid.
var (
	errKeyEmpty     = errors.New("the key is empty")
	errKeyTooLong   = errors.New("the key is too long")
	errKeyMalformed = errors.New("the key is neither an RFC 8941 string nor a bare token")
	errKeyRepeated  = errors.New("the key header appears more than once")
)

// headerKey returns the key the request's header carries: "" when there is
// none, an error when it is malformed. It makes no store call.
func headerKey(h http.Header, name string, maxLen int) (string, error) {
	vs := h[name]
	switch len(vs) {
	case 0:
		return "", nil
	case 1:
	default:
		// Two fields may be two clients' keys folded by a proxy: neither
		// can be trusted to be the one the client meant.
		return "", errKeyRepeated
	}
	return parseKey(vs[0], maxLen)
}

// parseKey parses an Idempotency-Key field value: an RFC 8941 sf-string
// ("..." with \" and \\ the only escapes, printable ASCII inside) or, as
// Stripe's clients send it, a bare value of RFC 8941 token characters
// (tchar, ':' and '/'). The key is the string's content, so "abc" and abc
// are one key. Parameters after the string are refused: the draft defines
// none, and a value that carries them is more likely a mistake than a key.
// A key is 1 to maxLen bytes.
func parseKey(v string, maxLen int) (string, error) {
	// RFC 8941 §4.2: leading and trailing spaces are discarded.
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", errKeyEmpty
	}
	if v[0] != '"' {
		if len(v) > maxLen {
			return "", errKeyTooLong
		}
		for i := 0; i < len(v); i++ {
			if !isKeyTokenChar(v[i]) {
				return "", errKeyMalformed
			}
		}
		return v, nil
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", errKeyMalformed
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", errKeyMalformed
			}
			if b.Len() == 0 {
				return "", errKeyEmpty
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", errKeyMalformed
		default:
			b.WriteByte(c)
		}
		if b.Len() > maxLen {
			return "", errKeyTooLong
		}
	}
	return "", errKeyMalformed // no closing quote
}

// isKeyTokenChar reports the characters of a bare key: RFC 8941 token
// characters (RFC 9110 tchar, ':' and '/'). No comma, space or quote, so a
// value a proxy folded from two fields ("a, b") is refused.
func isKeyTokenChar(c byte) bool {
	return isTchar(c) || c == ':' || c == '/'
}
