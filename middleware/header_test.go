package middleware

import (
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`abc`, "abc"},
		{`"abc"`, "abc"},
		{`  "abc" `, "abc"},
		{`"a b,c"`, "a b,c"},
		{`"a\"b\\c"`, `a"b\c`},
		{`8e03978e-40d5-43e8-bc93-6894a57f9324`, "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{"!#$%&'*+-.^_`|~:/", "!#$%&'*+-.^_`|~:/"},
		{strings.Repeat("k", 255), strings.Repeat("k", 255)},
		{`"` + strings.Repeat(`\"`, 255) + `"`, strings.Repeat(`"`, 255)},
	} {
		got, err := parseKey(tc.in, 255)
		if err != nil || got != tc.want {
			t.Errorf("parseKey(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", " ", `""`, `"`, `"abc`, `"abc"x`, `"abc";a=1`, `a b`, `a,b`, `a;b`, `a"b`,
		`"\a"`, "\"\t\"", "\"\x7f\"", "caf\xc3\xa9", "(a)", "a=b", strings.Repeat("k", 256), `"` + strings.Repeat("k", 256) + `"`} {
		if got, err := parseKey(in, 255); err == nil {
			t.Errorf("parseKey(%q) = %q; want an error", in, got)
		}
	}
}

// FuzzParseKey: no panic, and every accepted key follows the rules: 1 to
// 255 bytes of printable ASCII; a bare value is its own key and all token
// characters; a quoted one is its key serialized as an sf-string.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`abc`, `"abc"`, `"a\"b"`, `a, b`, `"`, `""`, "\"\x00\"", `"a\`, ` "x" `} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		key, err := parseKey(in, 255)
		if err != nil {
			return
		}
		if key == "" || len(key) > 255 {
			t.Fatalf("parseKey(%q) = %q: length %d outside 1..255", in, key, len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("parseKey(%q) = %q: byte %#x is not printable ASCII", in, key, key[i])
			}
		}
		v := strings.Trim(in, " \t")
		if v[0] != '"' {
			if v != key {
				t.Fatalf("bare parseKey(%q) = %q; want the value itself", in, key)
			}
			for i := 0; i < len(key); i++ {
				if !isKeyTokenChar(key[i]) {
					t.Fatalf("bare parseKey(%q) accepted %q", in, key[i])
				}
			}
			return
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		if quoted != v {
			t.Fatalf("parseKey(%q) = %q, which serializes as %q", in, key, quoted)
		}
	})
}

// Options.Header and Options.Methods change what is covered.
func TestHeaderAndMethods(t *testing.T) {
	s := newCounting()
	var c counter
	h := mustNew(t, Options{SingleTenant: true, Store: s, Header: "x-request-key", Methods: []string{"PUT"}}, &c)
	for range 2 {
		do(h, req{method: "PUT", body: "{}", header: map[string]string{"X-Request-Key": "k"}})
	}
	do(h, req{method: "POST", key: "k", body: "{}"})
	if c.runs.Load() != 2 {
		t.Errorf("handler ran %d times; want 2 (PUT once, POST not covered)", c.runs.Load())
	}
}
