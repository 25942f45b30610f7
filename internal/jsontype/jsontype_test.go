package jsontype

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

type receipt struct{ ID string }
type hidden struct{ id string }
type withChan struct {
	ID   string
	Done chan struct{}
}
type skipped struct {
	ID   string
	Done chan struct{} `json:"-"`
}
type inner struct{ n int }
type embeds struct {
	ID string
	inner
}
type list struct {
	Next *list
	Fn   func()
}
type textKey struct{ a, b int }

func (k textKey) MarshalText() ([]byte, error) { return fmt.Appendf(nil, "%d/%d", k.a, k.b), nil }
func (k *textKey) UnmarshalText(b []byte) error {
	_, err := fmt.Sscanf(string(b), "%d/%d", &k.a, &k.b)
	return err
}

type raw struct{ c chan int }

func (raw) MarshalJSON() ([]byte, error) { return []byte("1"), nil }
func (*raw) UnmarshalJSON([]byte) error  { return nil }

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		t    reflect.Type
		says string // "" when accepted
	}{
		{reflect.TypeFor[int](), ""},
		{reflect.TypeFor[[]byte](), ""},
		{reflect.TypeFor[any](), ""},
		{reflect.TypeFor[map[string]any](), ""},
		{reflect.TypeFor[receipt](), ""},
		{reflect.TypeFor[*receipt](), ""},
		{reflect.TypeFor[skipped](), ""},
		{reflect.TypeFor[embeds](), ""},
		{reflect.TypeFor[time.Time](), ""},
		{reflect.TypeFor[json.RawMessage](), ""},
		{reflect.TypeFor[map[textKey]int](), ""},
		{reflect.TypeFor[raw](), ""},
		{reflect.TypeFor[struct{}](), ""},
		{reflect.TypeFor[chan int](), "chan int: JSON cannot encode a channel"},
		{reflect.TypeFor[func() int](), "func() int: JSON cannot encode a func"},
		{reflect.TypeFor[complex128](), "complex128: JSON cannot encode a complex number"},
		{reflect.TypeFor[error](), "error: JSON cannot decode into an interface with methods"},
		{reflect.TypeFor[withChan](), "jsontype.withChan.Done (chan struct {}): JSON cannot encode a channel"},
		{reflect.TypeFor[[]*withChan](), "[]*jsontype.withChan[].Done (chan struct {}): JSON cannot encode a channel"},
		{reflect.TypeFor[list](), "jsontype.list.Fn (func()): JSON cannot encode a func"},
		{reflect.TypeFor[hidden](), "jsontype.hidden: its fields are all unexported, and JSON records it as {}"},
		{reflect.TypeFor[map[string]hidden](), "map[string]jsontype.hidden[key] (jsontype.hidden): its fields are all unexported"},
		{reflect.TypeFor[map[[2]int]string](), "JSON cannot use a [2]int as an object's key"},
		{reflect.TypeFor[struct{ Err error }](), ".Err (error): JSON cannot decode into an interface with methods"},
	} {
		err := Check(c.t)
		switch {
		case c.says == "" && err != nil:
			t.Errorf("Check(%v) = %v; want nil", c.t, err)
		case c.says != "" && (err == nil || !strings.Contains(err.Error(), c.says)):
			t.Errorf("Check(%v) = %v; want an error saying %q", c.t, err, c.says)
		}
		// The refusals agree with encoding/json where a zero value shows it.
		if k := c.t.Kind(); strings.Contains(c.says, "cannot encode") && k != reflect.Pointer && k != reflect.Slice && k != reflect.Map {
			if _, jerr := json.Marshal(reflect.New(c.t).Elem().Interface()); jerr == nil {
				t.Errorf("json.Marshal of a zero %v succeeded; Check refuses it as %q", c.t, c.says)
			}
		}
	}
	if a, b := Check(reflect.TypeFor[withChan]()), Check(reflect.TypeFor[withChan]()); a == nil || !errors.Is(b, a) {
		t.Errorf("Check twice = %v, %v; want the same error, kept", a, b)
	}
}

// The types above are read only by reflection; this keeps them in use.
var _ = []any{hidden{}.id, embeds{}.inner.n, raw{}.c}
