package api

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"
)

var (
	nameRE     = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	labelKeyRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,126}[A-Za-z0-9])?$`)
)

// Limits on free-form fields, shared by validation here and CHECK constraints in the database.
const (
	MaxDisplayName = 200
	MaxDescription = 2000
	MaxLabels      = 64
	MaxLabelValue  = 256
)

// ValidateName checks a resource name: a DNS label (lowercase letters, digits and '-', 1 to 63
// characters, starting and ending with a letter or digit).
func ValidateName(field, name string) error {
	if name == "" {
		return InvalidField(field, "is required")
	}
	if !nameRE.MatchString(name) {
		return InvalidField(field, "%q is not a valid name: use 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit", name)
	}
	return nil
}

// ValidateText checks a free-form text field against a length limit in characters.
func ValidateText(field, s string, max int) error {
	if !utf8.ValidString(s) {
		return InvalidField(field, "is not valid UTF-8")
	}
	if n := utf8.RuneCountInString(s); n > max {
		return InvalidField(field, "is %d characters long; the limit is %d", n, max)
	}
	return nil
}

// ValidateLabels checks a label map: at most MaxLabels entries, keys of letters, digits and
// "._/-" (128 characters at most), values of at most MaxLabelValue characters.
func ValidateLabels(field string, labels map[string]string) error {
	if len(labels) > MaxLabels {
		return InvalidField(field, "has %d labels; the limit is %d", len(labels), MaxLabels)
	}
	for k, v := range labels {
		if !labelKeyRE.MatchString(k) {
			return InvalidField(field, "label key %q is not valid: use letters, digits and '._/-', starting and ending with a letter or digit, 128 characters at most", k)
		}
		if err := ValidateText(field+"."+k, v, MaxLabelValue); err != nil {
			return err
		}
	}
	return nil
}

// ValidateRef checks a reference to a resource by id or name.
func ValidateRef(field, ref string) error {
	if ref == "" {
		return InvalidField(field, "is required: give an id or a name")
	}
	if len(ref) > 253 {
		return InvalidField(field, "is %d characters long; an id or a name is at most 253", len(ref))
	}
	return nil
}

// first returns the first non-nil error.
func first(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// ValidateEnum checks that v is one of allowed (or empty, when empty means "any" or the
// default). The error names the field and lists the allowed values.
func ValidateEnum(field, v string, allowed ...string) error {
	if v == "" || slices.Contains(allowed, v) {
		return nil
	}
	return &Error{Code: CodeInvalidArgument,
		Message: fmt.Sprintf("%s: %q is not one of %s", field, v, strings.Join(allowed, ", ")),
		Details: map[string]any{"field": field, "allowed": allowed}}
}
