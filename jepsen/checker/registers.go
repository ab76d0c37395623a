// The registers model (-model registers): named compare-and-set registers, as rlog.state's
// versioned variables are. One completed operation per line:
//
//	{"process":0,"f":"fetch","name":"a","invoke":10,"complete":25,"result":"ok","version":3,"value":"x"}
//	{"process":1,"f":"store","name":"a","expect":3,"value":"y","invoke":12,"complete":30,"result":"ok","stored":true,"version":7}
//	{"process":2,"f":"store","name":"a","expect":3,"value":"z","invoke":13,"complete":31,"result":"ok","stored":false}
//
// A register's state is (version, value), (0, "") before any store.
//
//   - fetch -> (version, value): legal iff that is the state.
//   - store(expect, value) -> stored at version v: legal iff the state's version is expect
//     and v is above it; the state becomes (v, value).
//   - store(expect, value) -> refused: legal iff the state's version is not expect.
//   - a store whose outcome is unknown ("info") stays open until the end and may or may
//     not have happened: both next states are possible (a nondeterministic step). If it
//     happened, its version is the one some fetch saw with its value (values are unique);
//     if no fetch saw it, a version nobody else can name.
//   - "fail": certainly not done; dropped.
//
// Registers are independent: the history is partitioned by name.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"strings"

	"github.com/anishathalye/porcupine"
)

type registerRecord struct {
	Process  *int    `json:"process"`
	F        string  `json:"f"`
	Name     string  `json:"name"`
	Expect   *int64  `json:"expect"`
	Value    *string `json:"value"`
	Invoke   *int64  `json:"invoke"`
	Complete *int64  `json:"complete"`
	Result   string  `json:"result"`
	Stored   *bool   `json:"stored"`
	Version  *int64  `json:"version"`
	Error    string  `json:"error"`
}

type register struct {
	Version int64
	Value   string
}

type fetchInput struct{ Name string }

type storeInput struct {
	Name   string
	Expect int64
	Value  string
}

type storeOutput struct {
	Known   bool // false: outcome unknown
	Stored  bool
	Version int64 // stored (or, unknown, the version it has if it happened)
}

func registerStep(state, input, output interface{}) []interface{} {
	s := state.(register)
	switch in := input.(type) {
	case fetchInput:
		if output.(register) == s {
			return []interface{}{s}
		}
		return nil
	case storeInput:
		out := output.(storeOutput)
		if !out.Known {
			if s.Version != in.Expect {
				return []interface{}{s}
			}
			return []interface{}{s, register{out.Version, in.Value}}
		}
		if !out.Stored {
			if s.Version != in.Expect {
				return []interface{}{s}
			}
			return nil
		}
		if s.Version == in.Expect && out.Version > s.Version {
			return []interface{}{register{out.Version, in.Value}}
		}
		return nil
	}
	return nil
}

func nameOf(input interface{}) string {
	switch in := input.(type) {
	case fetchInput:
		return in.Name
	case storeInput:
		return in.Name
	}
	return ""
}

var registerModel = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byName := map[string][]porcupine.Operation{}
		var names []string
		for _, op := range history {
			name := nameOf(op.Input)
			if _, ok := byName[name]; !ok {
				names = append(names, name)
			}
			byName[name] = append(byName[name], op)
		}
		var parts [][]porcupine.Operation
		for _, name := range names {
			parts = append(parts, byName[name])
		}
		return parts
	},
	Init: func() []interface{} { return []interface{}{register{0, ""}} },
	Step: registerStep,
	Hash: func(state interface{}) uint64 {
		s := state.(register)
		h := fnv.New64a()
		fmt.Fprintf(h, "%d\x00%s", s.Version, s.Value)
		return h.Sum64()
	},
	DescribeOperation: func(input, output interface{}) string {
		switch in := input.(type) {
		case fetchInput:
			out := output.(register)
			return fmt.Sprintf("fetch(%s) -> v%d %q", in.Name, out.Version, out.Value)
		case storeInput:
			out := output.(storeOutput)
			switch {
			case !out.Known:
				return fmt.Sprintf("store(%s, v%d, %q) -> ?", in.Name, in.Expect, in.Value)
			case out.Stored:
				return fmt.Sprintf("store(%s, v%d, %q) -> v%d", in.Name, in.Expect, in.Value, out.Version)
			}
			return fmt.Sprintf("store(%s, v%d, %q) -> refused", in.Name, in.Expect, in.Value)
		}
		return "?"
	},
	DescribeState: func(state interface{}) string {
		s := state.(register)
		return fmt.Sprintf("v%d %q", s.Version, s.Value)
	},
}

func validateRegister(rec registerRecord) error {
	if rec.Process == nil || rec.Invoke == nil || rec.Complete == nil || rec.Name == "" {
		return fmt.Errorf("process, name, invoke and complete are required")
	}
	if *rec.Complete < *rec.Invoke {
		return fmt.Errorf("complete before invoke")
	}
	switch rec.Result {
	case "ok", "fail", "info":
	default:
		return fmt.Errorf("result %q is not ok, fail or info", rec.Result)
	}
	switch rec.F {
	case "fetch":
		if rec.Result == "ok" && (rec.Version == nil || rec.Value == nil) {
			return fmt.Errorf("an ok fetch needs version and value")
		}
		if rec.Result == "info" {
			return fmt.Errorf("a fetch cannot have an unknown outcome (it changes nothing): use fail")
		}
	case "store":
		if rec.Expect == nil || rec.Value == nil {
			return fmt.Errorf("a store needs expect and value")
		}
		if rec.Result == "ok" && (rec.Stored == nil || (*rec.Stored && rec.Version == nil)) {
			return fmt.Errorf("an ok store needs stored (and version when stored)")
		}
	default:
		return fmt.Errorf("f %q is not fetch or store", rec.F)
	}
	return nil
}

func parseRegisterHistory(r io.Reader) ([]porcupine.Operation, summary, error) {
	var sum summary
	var records []registerRecord
	scanner := bufio.NewScanner(r)
	scanner.Buffer(make([]byte, 1024*1024), 256*1024*1024)
	line := 0
	for scanner.Scan() {
		line++
		text := strings.TrimSpace(scanner.Text())
		if text == "" {
			continue
		}
		var rec registerRecord
		decoder := json.NewDecoder(strings.NewReader(text))
		decoder.DisallowUnknownFields()
		if err := decoder.Decode(&rec); err != nil {
			return nil, sum, fmt.Errorf("line %d: %v", line, err)
		}
		if err := validateRegister(rec); err != nil {
			return nil, sum, fmt.Errorf("line %d: %v", line, err)
		}
		records = append(records, rec)
	}
	if err := scanner.Err(); err != nil {
		return nil, sum, err
	}
	// The version a fetch saw with each value: an unknown store's version if it happened.
	seen := map[string]int64{}
	var maxTime int64
	for _, rec := range records {
		if *rec.Complete > maxTime {
			maxTime = *rec.Complete
		}
		if rec.F == "fetch" && rec.Result == "ok" {
			seen[rec.Name+"\x00"+*rec.Value] = *rec.Version
		}
	}
	var ops []porcupine.Operation
	unseen := int64(0)
	for i, rec := range records {
		if rec.Result == "fail" {
			sum.Failed++
			continue
		}
		op := porcupine.Operation{ClientId: *rec.Process, Call: *rec.Invoke, Return: *rec.Complete}
		if rec.F == "fetch" {
			sum.Reads++
			op.Input = fetchInput{rec.Name}
			op.Output = register{*rec.Version, *rec.Value}
		} else {
			sum.Appends++
			op.Input = storeInput{rec.Name, *rec.Expect, *rec.Value}
			switch {
			case rec.Result == "info":
				sum.Unknown++
				version, ok := seen[rec.Name+"\x00"+*rec.Value]
				if !ok {
					unseen--
					version = unseen - int64(i) // below every real version: nobody can name it
				}
				op.Output = storeOutput{false, false, version}
				op.Return = maxTime + 1
				op.ClientId = -1 - i // its process went on without it
			case *rec.Stored:
				op.Output = storeOutput{true, true, *rec.Version}
			default:
				op.Output = storeOutput{true, false, 0}
			}
		}
		ops = append(ops, op)
	}
	sum.Operations = len(ops)
	return ops, sum, nil
}
