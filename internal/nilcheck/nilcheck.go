// Package nilcheck tells a nil interface value from one that holds a nil
// pointer (a typed nil), which == nil does not: a (*RedisStore)(nil) given
// as an idem.Store is not == nil, and panics on first use, far from the
// mistake. Constructors check with it so that the mistake fails where it is
// made.
package nilcheck

import "reflect"

// Nil reports whether v is nil or holds a nil pointer, map, slice, channel
// or function.
func Nil(v any) bool {
	if v == nil {
		return true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface:
		return r.IsNil()
	}
	return false
}
