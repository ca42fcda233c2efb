package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// Every subcommand takes its options GNU style, as exec takes flock's
// (execflags.go): long options --name, --name=VALUE or --name VALUE, a
// boolean also --name=false or --no-name, a long name abbreviated to any
// unambiguous prefix (getopt_long); short options -x from the table below,
// clustered (-jw) and with their value attached or apart (-i2s, -i 2s);
// options and operands in any order, -- ends the options. A long option
// written with one dash (-json, Go's flag style) is still accepted.
// The options themselves stay flag.FlagSet definitions in each subcommand.

// shortOptions maps, per subcommand, a short option letter to its long
// option. -t is --table everywhere.
var shortOptions = map[string]map[byte]string{
	"dump":   {'t': "table", 'j': "json", 'w': "watch", 'i': "interval", 'c': "check"},
	"serve":  {'t': "table", 'm': "metrics"},
	"stress": {'t': "table", 'p': "procs", 'g': "goroutines", 'd': "duration", 'j': "json"},
	"demo":   {'t': "table", 'p': "procs", 'r': "rounds"},
}

// errHelp is returned by the parsers for -h/--help.
var errHelp = errors.New("help requested")

type boolFlag interface{ IsBoolFlag() bool }

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(boolFlag)
	return ok && b.IsBoolFlag()
}

// parseGNU parses args over fs, GNU style, with the short options short
// (letters for flags fs does not define are ignored). It returns the
// operands, or a usage error, or errHelp.
func parseGNU(fs *flag.FlagSet, short map[byte]string, args []string) ([]string, error) {
	var operands []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return append(operands, args[i+1:]...), nil
		case len(a) < 2 || a[0] != '-':
			operands = append(operands, a)
			continue
		case a == "-h" || a == "--help" || a == "-help":
			return nil, errHelp
		}
		next := func() (string, bool) {
			if i+1 >= len(args) {
				return "", false
			}
			i++
			return args[i], true
		}
		body, dashes := strings.TrimPrefix(a[1:], "-"), 1
		if strings.HasPrefix(a, "--") {
			dashes = 2
		}
		name, val, hasVal := strings.Cut(body, "=")
		if dashes == 2 || fs.Lookup(name) != nil && len(name) > 1 {
			if err := setLong(fs, name, val, hasVal, next); err != nil {
				return nil, err
			}
			continue
		}
		// A cluster of short options.
		for j := 1; j < len(a); j++ {
			long, ok := short[a[j]]
			f := fs.Lookup(long)
			if !ok || f == nil {
				return nil, fmt.Errorf("unknown option -%c", a[j])
			}
			if isBool(f) {
				if err := setValue(fs, f, "true"); err != nil {
					return nil, err
				}
				continue
			}
			v := a[j+1:]
			if v == "" {
				var ok bool
				if v, ok = next(); !ok {
					return nil, fmt.Errorf("option -%c (--%s) needs %s", a[j], f.Name, valueName(f))
				}
			}
			if err := setValue(fs, f, v); err != nil {
				return nil, err
			}
			break
		}
	}
	return operands, nil
}

// setLong sets the long option name (its value val if hasVal, else from
// next if it takes one).
func setLong(fs *flag.FlagSet, name, val string, hasVal bool, next func() (string, bool)) error {
	f, neg, err := lookupLong(fs, name)
	if err != nil {
		return err
	}
	switch {
	case neg && hasVal:
		return fmt.Errorf("option --no-%s takes no value", f.Name)
	case neg:
		return setValue(fs, f, "false")
	case isBool(f) && !hasVal:
		return setValue(fs, f, "true")
	case isBool(f):
		return setValue(fs, f, val)
	case !hasVal:
		var ok bool
		if val, ok = next(); !ok {
			return fmt.Errorf("option --%s needs %s", f.Name, valueName(f))
		}
	}
	return setValue(fs, f, val)
}

// lookupLong finds the flag a long option names: exactly, as --no-NAME of a
// boolean, or as the unambiguous prefix of one name.
func lookupLong(fs *flag.FlagSet, name string) (f *flag.Flag, neg bool, err error) {
	if f := fs.Lookup(name); f != nil {
		return f, false, nil
	}
	if n, ok := strings.CutPrefix(name, "no-"); ok {
		if f := fs.Lookup(n); f != nil && isBool(f) {
			return f, true, nil
		}
	}
	var match []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, name) {
			match = append(match, f)
		}
	})
	switch len(match) {
	case 1:
		return match[0], false, nil
	case 0:
		return nil, false, fmt.Errorf("unknown option --%s", name)
	}
	var names []string
	for _, f := range match {
		names = append(names, "--"+f.Name)
	}
	return nil, false, fmt.Errorf("option --%s is ambiguous (%s)", name, strings.Join(names, ", "))
}

func setValue(fs *flag.FlagSet, f *flag.Flag, v string) error {
	if f.Name == "table" && v == "" {
		return fmt.Errorf("option --table needs a non-empty PATH (leave it out for the default table)")
	}
	if err := fs.Set(f.Name, v); err != nil {
		return fmt.Errorf("invalid value %q for --%s: %v", v, f.Name, unwrapFlagErr(err))
	}
	return nil
}

// unwrapFlagErr drops the flag package's "parse error" wording.
func unwrapFlagErr(err error) error {
	if u := errors.Unwrap(err); u != nil {
		return u
	}
	return err
}

// metavars name the values of options whose usage does not.
var metavars = map[string]string{"table": "PATH", "metrics": "ADDR"}

// valueName is the metavariable of f's value: the back-quoted word of its
// usage, else its type, upper case.
func valueName(f *flag.Flag) string {
	if n, ok := metavars[f.Name]; ok {
		return n
	}
	if _, ok := f.Value.(durationValue); ok {
		return "DURATION"
	}
	n, _ := flag.UnquoteUsage(f)
	if n == "" {
		n = "value"
	}
	return strings.ToUpper(n)
}

// printOptions lists fs's options GNU style on w.
func printOptions(w io.Writer, fs *flag.FlagSet, short map[byte]string) {
	letter := map[string]byte{}
	for c, l := range short {
		letter[l] = c
	}
	type line struct{ spec, usage string }
	var lines []line
	width := 0
	fs.VisitAll(func(f *flag.Flag) {
		spec := "    "
		if c, ok := letter[f.Name]; ok {
			spec = fmt.Sprintf("-%c, ", c)
		}
		_, usage := flag.UnquoteUsage(f)
		switch {
		case isBool(f) && f.DefValue == "true":
			spec += "--[no-]" + f.Name
			usage += " (default on)"
		case isBool(f):
			spec += "--" + f.Name
		default:
			spec += "--" + f.Name + " " + valueName(f)
			if d := f.DefValue; d != "" && d != "0" && d != "0s" {
				usage += fmt.Sprintf(" (default %s)", d)
			}
		}
		lines = append(lines, line{spec, usage})
	})
	lines = append(lines, line{"-h, --help", "this help"})
	for _, l := range lines {
		width = max(width, len(l.spec))
	}
	for _, l := range lines {
		fmt.Fprintf(w, "  %-*s  %s\n", width, l.spec, l.usage)
	}
}
