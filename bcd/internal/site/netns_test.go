package site

const childEnv = "BCD_SITE_TEST_CHILD"

func runChild(spec string) int { return 2 }
