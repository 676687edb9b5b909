package api

import (
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The range every time in an input must lie in. PostgreSQL holds far more, but Go's JSON
// encoding fails past year 9999, and an answer that cannot be encoded is lost after its
// transaction committed. MaxTime leaves room for the durations added to an input time (each at
// most a hundred years), so every time the API computes from an input is still representable.
var (
	MinTime = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	MaxTime = time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC)
)

// The range of an integer input: what a PostgreSQL integer (int4) column holds. A field whose
// column is a bigint carries the struct tag `input:"int8"`.
const (
	MinInt = math.MinInt32
	MaxInt = math.MaxInt32
)

var (
	timeType = reflect.TypeFor[time.Time]()
	rawType  = reflect.TypeFor[json.RawMessage]()
)

// CheckInput applies the rules every API input obeys, whatever its method, before anything
// reaches IAM or the database: every string (map keys included, and the strings inside raw
// JSON) is text (valid UTF-8 without control characters other than tab and line breaks, and
// without non-characters: TextRune), every time lies within [MinTime, MaxTime), every
// integer fits its column, every float is finite. The error names the field by its JSON path
// (labels.gpu, members[2].model). The envelope runs it on every call, HTTP or in-process.
func CheckInput(in any) error {
	if in == nil {
		return nil
	}
	return checkValue("", reflect.ValueOf(in), "")
}

func checkValue(path string, v reflect.Value, tag string) error {
	if !v.IsValid() {
		return nil
	}
	switch v.Type() {
	case timeType:
		return CheckTime(path, v.Interface().(time.Time))
	case rawType:
		return checkRaw(path, v.Bytes())
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return checkValue(path, v.Elem(), tag)
	case reflect.String:
		return CheckString(path, v.String())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return checkInt(path, v.Int(), tag)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		if v.Uint() > math.MaxInt64 {
			return InvalidField(fieldName(path), "%d is out of range", v.Uint())
		}
		return checkInt(path, int64(v.Uint()), tag)
	case reflect.Float32, reflect.Float64:
		if f := v.Float(); math.IsNaN(f) || math.IsInf(f, 0) {
			return InvalidField(fieldName(path), "must be a finite number")
		}
	case reflect.Struct:
		return checkStruct(path, v)
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Uint8 {
			return nil // bytes are not text
		}
		for i := range v.Len() {
			if err := checkValue(path+"["+strconv.Itoa(i)+"]", v.Index(i), tag); err != nil {
				return err
			}
		}
	case reflect.Map:
		iter := v.MapRange()
		for iter.Next() {
			k := iter.Key()
			if k.Kind() == reflect.String {
				if err := checkKey(path, k.String()); err != nil {
					return err
				}
				if err := checkValue(join(path, k.String()), iter.Value(), tag); err != nil {
					return err
				}
				continue
			}
			if err := checkValue(path, k, tag); err != nil {
				return err
			}
			if err := checkValue(path, iter.Value(), tag); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkStruct(path string, v reflect.Value) error {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		p := path
		switch {
		case f.Anonymous && name == "":
			// An embedded struct's fields are the outer object's own (encoding/json flattens them).
		case name != "":
			p = join(path, name)
		default:
			p = join(path, f.Name)
		}
		if err := checkValue(p, v.Field(i), f.Tag.Get("input")); err != nil {
			return err
		}
	}
	return nil
}

// checkRaw checks the strings of a raw JSON value (command arguments and the like): PostgreSQL's
// jsonb refuses \u0000, and the value is stored as it came.
func checkRaw(path string, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if !utf8.Valid(b) {
		return InvalidField(fieldName(path), "is not valid UTF-8")
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return InvalidField(fieldName(path), "is not valid JSON")
	}
	return checkJSON(path, v)
}

func checkJSON(path string, v any) error {
	switch x := v.(type) {
	case string:
		return CheckString(path, x)
	case []any:
		for i, e := range x {
			if err := checkJSON(path+"["+strconv.Itoa(i)+"]", e); err != nil {
				return err
			}
		}
	case map[string]any:
		for k, e := range x {
			if err := checkKey(path, k); err != nil {
				return err
			}
			if err := checkJSON(join(path, k), e); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkInt(path string, n int64, tag string) error {
	if tag == "int8" {
		return nil
	}
	if n < MinInt || n > MaxInt {
		return InvalidField(fieldName(path), "%d is out of range: at most %d", n, MaxInt)
	}
	return nil
}

// CheckString refuses what is not text: invalid UTF-8, and runes TextRune refuses.
func CheckString(field, s string) error {
	if !utf8.ValidString(s) {
		return InvalidField(fieldName(field), "is not valid UTF-8")
	}
	if i := strings.IndexFunc(s, func(r rune) bool { return !TextRune(r) }); i >= 0 {
		r, _ := utf8.DecodeRuneInString(s[i:])
		if r == 0 {
			return InvalidField(fieldName(field), "contains a NUL byte")
		}
		return InvalidField(fieldName(field), "contains %U at byte %d: control characters (other than tab and line breaks) and non-characters are not text", r, i)
	}
	return nil
}

// TextRune reports whether r may appear in the API's text. Controls other than tab, line feed
// and carriage return, and Unicode's non-characters, are not text: the database could store
// them, but YAML cannot carry them (an export holding one could not be written) and a terminal
// obeys them (a tenant's name could drive an operator's terminal).
func TextRune(r rune) bool {
	switch {
	case r == '\t' || r == '\n' || r == '\r':
		return true
	case r < 0x20 || (r >= 0x7f && r <= 0x9f):
		return false
	case r >= 0xfdd0 && r <= 0xfdef, r&0xfffe == 0xfffe:
		return false
	}
	return true
}

func checkKey(path, k string) error {
	if CheckString(path, k) != nil {
		return InvalidField(fieldName(path), "has a key %q that is not text (valid UTF-8 without control characters or non-characters)", k)
	}
	return nil
}

// CheckTime refuses a time outside [MinTime, MaxTime). The zero time is "not given" and passes;
// whether it is required is the method's own check.
func CheckTime(field string, t time.Time) error {
	if t.IsZero() {
		return nil
	}
	if t.Before(MinTime) || !t.Before(MaxTime) {
		return InvalidField(fieldName(field), "%s is outside the range this API accepts: from %s to before %s",
			formatTime(t), MinTime.Format(time.RFC3339), MaxTime.Format(time.RFC3339))
	}
	return nil
}

// formatTime formats any time, including those RFC 3339 cannot express.
func formatTime(t time.Time) string {
	if y := t.UTC().Year(); y < 0 || y > 9999 {
		return "year " + strconv.Itoa(y)
	}
	return t.UTC().Format(time.RFC3339)
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func fieldName(path string) string {
	if path == "" {
		return "body"
	}
	return path
}
