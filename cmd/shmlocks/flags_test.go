package main

import (
	"flag"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// parseGNU: long options with = or apart, booleans with =false or --no-,
// unambiguous prefixes, short clusters with values attached or apart,
// operands anywhere, -- ends the options, Go's one-dash long options.
func TestParseGNU(t *testing.T) {
	type opts struct {
		json, watch, names bool
		interval           time.Duration
		table              string
		procs              int
	}
	newFS := func() (*flag.FlagSet, *opts) {
		o := &opts{}
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.BoolVar(&o.json, "json", false, "")
		fs.BoolVar(&o.watch, "watch", false, "")
		fs.BoolVar(&o.names, "names", true, "")
		fs.DurationVar(&o.interval, "interval", time.Second, "")
		fs.StringVar(&o.table, "table", "", "")
		fs.IntVar(&o.procs, "procs", 4, "")
		return fs, o
	}
	short := map[byte]string{'j': "json", 'w': "watch", 'i': "interval", 't': "table", 'p': "procs", 'z': "absent"}
	for _, c := range []struct {
		args     []string
		want     opts
		operands []string
	}{
		{[]string{"--json", "--interval", "2s", "--table=/t"}, opts{json: true, names: true, interval: 2 * time.Second, table: "/t", procs: 4}, nil},
		{[]string{"-jw", "-i2s", "-t", "/t", "-p8"}, opts{json: true, watch: true, names: true, interval: 2 * time.Second, table: "/t", procs: 8}, nil},
		{[]string{"-jt/t"}, opts{json: true, names: true, interval: time.Second, table: "/t", procs: 4}, nil},
		{[]string{"--no-names", "--json=false", "--int=3s", "--pro", "2"}, opts{interval: 3 * time.Second, procs: 2}, nil},
		{[]string{"--names=false", "-json", "-interval", "5s"}, opts{json: true, interval: 5 * time.Second, procs: 4}, nil},
		{[]string{"a", "--json", "b", "--", "--watch", "-j"}, opts{json: true, names: true, interval: time.Second, procs: 4}, []string{"a", "b", "--watch", "-j"}},
		{[]string{"-", "-j"}, opts{json: true, names: true, interval: time.Second, procs: 4}, []string{"-"}},
	} {
		fs, o := newFS()
		operands, err := parseGNU(fs, short, c.args)
		require.NoError(t, err, "%q", c.args)
		require.Equal(t, c.want, *o, "%q", c.args)
		require.Equal(t, c.operands, operands, "%q", c.args)
	}
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"--bogus"}, "unknown option --bogus"},
		{[]string{"-q"}, "unknown option -q"},
		{[]string{"-z"}, "unknown option -z"},
		{[]string{"-jq"}, "unknown option -q"},
		{[]string{"--interval"}, "option --interval needs DURATION"},
		{[]string{"-i"}, "option -i (--interval) needs DURATION"},
		{[]string{"--interval", "soon"}, `invalid value "soon" for --interval`},
		{[]string{"--json=maybe"}, `invalid value "maybe" for --json`},
		{[]string{"--no-interval"}, "unknown option --no-interval"},
		{[]string{"--no-json=1"}, "takes no value"},
		{[]string{"--table", ""}, "non-empty PATH"},
		{[]string{"-t", ""}, "non-empty PATH"},
		{[]string{"--table="}, "non-empty PATH"},
		{[]string{"--p"}, "option --procs needs INT"}, // a prefix of --procs only
	} {
		fs, _ := newFS()
		_, err := parseGNU(fs, short, c.args)
		require.ErrorContains(t, err, c.err, "%q", c.args)
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Bool("watch", false, "")
	fs.Bool("warn", false, "")
	_, err := parseGNU(fs, nil, []string{"--wa"})
	require.ErrorContains(t, err, "ambiguous")
	_, err = parseGNU(fs, nil, []string{"--help"})
	require.ErrorIs(t, err, errHelp)
}
