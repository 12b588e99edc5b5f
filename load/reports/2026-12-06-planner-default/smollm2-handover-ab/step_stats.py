import json,sys,glob
for b in sorted(glob.glob(sys.argv[1]+'/runs/*.before.json')):
    a=b.replace('.before','.after'); B=json.load(open(b)); A=json.load(open(a))
    out=[]
    for i,mc in enumerate(A['models']):
        sc=mc['stats']; sp=B['models'][i]['stats']
        rows=[x-(sp['steps_by_rows'][j] if j<len(sp['steps_by_rows']) else 0) for j,x in enumerate(sc['steps_by_rows'])]
        steps=sum(rows); mean=sum(j*r for j,r in enumerate(rows))/max(steps,1)
        busy=(sc['busy']['secs']+sc['busy']['nanos']/1e9)-(sp['busy']['secs']+sp['busy']['nanos']/1e9)
        out.append(f"{mc['model']}: steps {steps} rows {mean:.2f} busy {busy:.1f}s committed {sc['tokens_committed']-sp['tokens_committed']}")
    print(b.split('/')[-1][:-12], '|', '; '.join(out))
