// Package jsontype tells, from a type alone, whether encoding/json can
// carry its values there and back: what Do checks before it runs any work
// whose result it would then fail to record, or record as something else.
package jsontype

import (
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
)

var (
	marshaler       = reflect.TypeFor[json.Marshaler]()
	unmarshaler     = reflect.TypeFor[json.Unmarshaler]()
	textMarshaler   = reflect.TypeFor[encoding.TextMarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// checked holds each type's answer: a type is walked once per process.
var checked sync.Map // reflect.Type -> error (nil stored as noProblem)

type ok struct{}

var noProblem = ok{}

// Check returns nil when values of t can be encoded by encoding/json and
// decoded back into a t, and otherwise an error naming the part of t at
// fault ("main.order.Items[].Done (chan int): JSON cannot encode a
// channel").
//
// It refuses what can never round-trip: channels, funcs, complex numbers,
// unsafe pointers; interfaces with methods (error, fmt.Stringer), which
// json.Unmarshal cannot fill; map keys that are not strings, integers or
// text marshalers; and structs whose fields are all unexported, which JSON
// records as {}. A type that marshals or unmarshals itself (time.Time, a
// json.Marshaler, a TextMarshaler) is taken at its word, as is any (the
// value in it is checked when it is encoded). Check is safe for
// concurrent use.
func Check(t reflect.Type) error {
	if v, found := checked.Load(t); found {
		if v == noProblem {
			return nil
		}
		return v.(error)
	}
	err := walk(t, t.String(), false, map[reflect.Type]bool{})
	if err == nil {
		checked.Store(t, noProblem)
	} else {
		checked.Store(t, err)
	}
	return err
}

func walk(t reflect.Type, path string, promoted bool, seen map[reflect.Type]bool) error {
	if seen[t] {
		return nil // a recursive type: its other paths are being walked
	}
	seen[t] = true
	refuse := func(why string) error {
		if path == t.String() {
			return fmt.Errorf("%s: %s", path, why)
		}
		return fmt.Errorf("%s (%v): %s", path, t, why)
	}
	if t.Kind() == reflect.Interface {
		if t.NumMethod() > 0 {
			return refuse("JSON cannot decode into an interface with methods")
		}
		return nil
	}
	if selfCoded(t) {
		return nil
	}
	switch t.Kind() {
	case reflect.Chan:
		return refuse("JSON cannot encode a channel")
	case reflect.Func:
		return refuse("JSON cannot encode a func")
	case reflect.Complex64, reflect.Complex128:
		return refuse("JSON cannot encode a complex number")
	case reflect.UnsafePointer:
		return refuse("JSON cannot encode an unsafe.Pointer")
	case reflect.Pointer:
		return walk(t.Elem(), path, promoted, seen)
	case reflect.Slice, reflect.Array:
		return walk(t.Elem(), path+"[]", false, seen)
	case reflect.Map:
		k := t.Key()
		switch k.Kind() {
		case reflect.String, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		default:
			if !k.Implements(textMarshaler) || !reflect.PointerTo(k).Implements(textUnmarshaler) {
				return refuse(fmt.Sprintf("JSON cannot use a %v as an object's key", k))
			}
		}
		return walk(t.Elem(), path+"[key]", false, seen)
	case reflect.Struct:
		encoded, hidden := 0, 0
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			if tag == "-" {
				continue
			}
			ft := f.Type
			if f.Anonymous && ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			embedded := f.Anonymous && ft.Kind() == reflect.Struct
			if !f.IsExported() && !embedded {
				hidden++
				continue
			}
			encoded++
			p := path + "." + f.Name
			name, _, _ := strings.Cut(tag, ",")
			if embedded && name == "" {
				p = path // its fields read as the outer struct's
			}
			if err := walk(f.Type, p, embedded && name == "", seen); err != nil {
				return err
			}
		}
		// An embedded struct with nothing to encode adds nothing to the
		// outer one, which is judged on its own.
		if encoded == 0 && hidden > 0 && !promoted {
			return refuse("its fields are all unexported, and JSON records it as {}")
		}
	}
	return nil
}

// selfCoded reports a type that encodes or decodes itself: encoding/json
// calls its methods instead of looking inside.
func selfCoded(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	return t.Implements(marshaler) || p.Implements(marshaler) || t.Implements(textMarshaler) ||
		p.Implements(textMarshaler) || p.Implements(unmarshaler) || p.Implements(textUnmarshaler)
}
