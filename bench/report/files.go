package report

import "flag"

// Files are where a run's results go besides its table: its -json and -svg
// flags, each written only when set.
type Files struct {
	JSON, SVG string
}

// RegisterJSON defines -json.
func (f *Files) RegisterJSON(fs *flag.FlagSet) {
	fs.StringVar(&f.JSON, "json", f.JSON, "also write the results as JSON to this `file`")
}

// Register defines -json and -svg.
func (f *Files) Register(fs *flag.FlagSet) {
	f.RegisterJSON(fs)
	fs.StringVar(&f.SVG, "svg", f.SVG, "also write a chart of the results to this SVG `file`")
}

// Write writes results as JSON and the charts, titled, as SVG; charts is
// called only when an SVG is asked for.
func (f Files) Write(results any, title string, charts func() []Chart) error {
	if f.JSON != "" {
		if err := WriteJSON(f.JSON, results); err != nil {
			return err
		}
	}
	if f.SVG != "" {
		return WriteSVG(f.SVG, title, charts()...)
	}
	return nil
}
