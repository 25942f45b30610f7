package sqlstore

import (
	"regexp"
	"strings"
	"testing"
)

// identRef is the documented table name: one or two plain identifiers,
// each at most 63 bytes, written independently of parseTable.
var identRef = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$`)

// FuzzParseTable: parseTable accepts exactly the documented names, and an
// accepted name is all that reaches the SQL text, quoted as it was given.
func FuzzParseTable(f *testing.F) {
	for _, s := range []string{
		"idem_keys", "idem.keys", "order", `keys"; DROP TABLE x; --`, "a.b.c", ".keys", "main.",
		strings.Repeat("t", 63), strings.Repeat("t", 64), "1keys", "clés", "k\x00", `"k"`, "a..b", "_", "_.k9",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tab, err := parseTable(s)
		if want := identRef.MatchString(s); want != (err == nil) {
			t.Fatalf("parseTable(%q) = %v; want accepted = %v", s, err, want)
		}
		if err != nil {
			return
		}
		want := `"` + strings.ReplaceAll(s, ".", `"."`) + `"`
		if got := tab.quoted(Postgres); got != want {
			t.Fatalf("parseTable(%q).quoted(Postgres) = %q; want %q", s, got, want)
		}
		if !plainIdent(tab.indexName()) {
			t.Fatalf("index name of %q = %q; want a plain identifier", s, tab.indexName())
		}
		for _, d := range []Dialect{Postgres, SQLite, MySQL} {
			q, _ := sqlText(d, tab, "SELECT 1 FROM {t} WHERE key = $1")
			w, key := want, "key"
			if d == MySQL {
				w, key = strings.ReplaceAll(want, `"`, "`"), "`key`"
			}
			if rest, ok := strings.CutPrefix(q, "SELECT 1 FROM "+w+" WHERE "+key+" = "); !ok || (rest != "$1" && rest != "?1" && rest != "?") {
				t.Fatalf("sqlText(%v, %q) = %q; want the quoted name and nothing else from it", d, s, q)
			}
		}
	})
}
