// Package badopt builds the one message every package of idem gives for an
// option that is wrong when a store, middleware, transport or adapter is
// built:
//
//	<pkg>: <Field>: <value> <rule>[; 0 means the default, <default>]
//
// as in "idem: LeaseTTL: -1s is negative; 0 means the default, 30s". The
// user reads the field to change first, then what they gave, then what is
// allowed, whichever package refused it; a negative value written to mean
// "none" learns what 0 does. The nested modules (grpc, otel, the consumer
// adapters with modules of their own) may not import it and write the same
// shape with fmt.Errorf.
package badopt

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
)

// Error returns the error "<pkg>: <field>: <value> <rule>", with rule
// formatted with args as by fmt.Sprintf. pkg is the package's name as the
// user imports it; field is the field as the user writes it in the literal
// (qualified, CacheOptions.MaxAge, where the package has several options
// structs to confuse). value is shown as Value shows it.
func Error(pkg, field string, value any, rule string, args ...any) error {
	return errors.New(pkg + ": " + field + ": " + Value(value) + " " + fmt.Sprintf(rule, args...))
}

// Default is Error for a field whose zero value means its default: the
// message ends "; 0 means the default, <def>", def shown with %v (a number,
// a duration, or words such as "no cap").
func Default(pkg, field string, value, def any, rule string, args ...any) error {
	return fmt.Errorf("%s: %s: %s %s; 0 means the default, %v", pkg, field, Value(value), fmt.Sprintf(rule, args...), def)
}

// Value shows an option's value as the user would recognise it in their
// literal: a string quoted (%q), nil as "nil", a nil pointer, func, map,
// channel or interface held in v as "(T)(nil)", any other pointer, func or
// channel by its type (its address means nothing to the reader), anything
// else with %v.
func Value(v any) string {
	if v == nil {
		return "nil"
	}
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Pointer, reflect.Func, reflect.Chan, reflect.Map, reflect.Interface:
		if r.IsNil() {
			return fmt.Sprintf("(%T)(nil)", v)
		}
		if r.Kind() != reflect.Map {
			return fmt.Sprintf("%T", v)
		}
	}
	return fmt.Sprint(v)
}
