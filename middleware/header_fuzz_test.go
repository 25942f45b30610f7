package middleware

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// The Idempotency-Key grammar, written independently of parseKey from
// draft-ietf-httpapi-idempotency-key-header (an Item whose value is an
// sf-string, RFC 8941 §3.3.3) and the documented bare-token exception, with
// the field's optional whitespace (RFC 9110 OWS: SP and HTAB) around it:
//
//	sf-string = DQUOTE *chr DQUOTE
//	chr       = unescaped / escaped
//	unescaped = %x20-21 / %x23-5B / %x5D-7E
//	escaped   = "\" ( DQUOTE / "\" )
//	bare      = 1*( tchar / ":" / "/" )
var (
	sfStringRef = regexp.MustCompile(`^[ \t]*"((?:[\x20\x21\x23-\x5B\x5D-\x7E]|\\["\\])*)"[ \t]*$`)
	bareRef     = regexp.MustCompile("^[ \\t]*([A-Za-z0-9!#$%&'*+\\-.^_`|~:/]+)[ \\t]*$")
	unescapeRef = strings.NewReplacer(`\\`, `\`, `\"`, `"`)
)

// refParseKey is the reference: the key a field value carries, and whether
// it is accepted (1 to maxLen bytes of content).
func refParseKey(v string, maxLen int) (string, bool) {
	var key string
	if m := sfStringRef.FindStringSubmatch(v); m != nil {
		key = unescapeRef.Replace(m[1])
	} else if m := bareRef.FindStringSubmatch(v); m != nil {
		key = m[1]
	} else {
		return "", false
	}
	return key, key != "" && len(key) <= maxLen
}

// FuzzParseKeyGrammar: parseKey accepts exactly what the grammar above
// accepts, with the same key, for any limit; it never panics.
func FuzzParseKeyGrammar(f *testing.F) {
	for _, s := range []string{
		`abc`, `"abc"`, `"a\"b\\c"`, `a, b`, `"`, `""`, "\"\x00\"", `"a\`, ` "x" `,
		"\t\"x\"\t", `"a"b"`, `"a";p=1`, `"\a"`, "\"\x7f\"", `"é"`, `*tok`, `123`, `a/b:c`,
		`"` + strings.Repeat("k", 255) + `"`, strings.Repeat("k", 256), `"\\"`, `"\""`, `" "`, `"a b"`,
	} {
		f.Add(s, 255)
		f.Add(s, 3)
	}
	f.Fuzz(func(t *testing.T, in string, maxLen int) {
		maxLen = 1 + (maxLen&0x7fffffff)%300 // 1..300: the limits worth telling apart
		got, err := parseKey(in, maxLen)
		want, ok := refParseKey(in, maxLen)
		if ok != (err == nil) || (ok && got != want) {
			t.Fatalf("parseKey(%q, %d) = %q, %v; the grammar says %q, accepted %v", in, maxLen, got, err, want, ok)
		}
	})
}

// FuzzParseKeyRoundTrip: every key a client may send (printable ASCII, 1 to
// 255 bytes) survives serialization as an sf-string, and as a bare token
// when it is made of token characters; any other key cannot be sent.
func FuzzParseKeyRoundTrip(f *testing.F) {
	for _, s := range []string{"abc", `a"b`, `a\b`, "a b", "8e03978e-40d5-43e8-bc93-6894a57f9324", "é", "\x00", strings.Repeat("x", 256)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		printable := key != "" && strings.IndexFunc(key, func(r rune) bool { return r < 0x20 || r > 0x7e }) < 0
		got, err := parseKey(quoted, 255)
		if printable && len(key) <= 255 {
			if err != nil || got != key {
				t.Fatalf("parseKey(%q) = %q, %v; want %q", quoted, got, err, key)
			}
		} else if err == nil {
			t.Fatalf("parseKey(%q) = %q; want an error: the key is not 1 to 255 printable ASCII bytes", quoted, got)
		}
		bare := key != "" && strings.IndexFunc(key, func(r rune) bool { return r > 0x7e || !isKeyTokenChar(byte(r)) }) < 0
		if bare && len(key) <= 255 {
			if got, err := parseKey(key, 255); err != nil || got != key {
				t.Fatalf("bare parseKey(%q) = %q, %v; want the key itself", key, got, err)
			}
		}
		// Through a header: one field is the key, two fields are refused.
		h := http.Header{}
		h.Add(DefaultHeader, quoted)
		if got2, err2 := headerKey(h, DefaultHeader, 255); got2 != got || (err2 == nil) != (err == nil) {
			t.Fatalf("headerKey with one field %q = %q, %v; want parseKey's %q, %v", quoted, got2, err2, got, err)
		}
		h.Add(DefaultHeader, quoted)
		if got2, err2 := headerKey(h, DefaultHeader, 255); err2 != errKeyRepeated {
			t.Fatalf("headerKey with two fields %q = %q, %v; want errKeyRepeated", quoted, got2, err2)
		}
	})
}
