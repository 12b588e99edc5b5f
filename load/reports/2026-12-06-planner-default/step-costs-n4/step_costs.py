import json,sys,glob
lab=lambda b: {0:'1',2:'2',3:'3'}.get(b) or (lambda o,u: f"{(1<<o)+(u*(1<<o)//2)}-{(1<<o)+((u+1)*(1<<o)//2)-1}")(b//2,b%2)
for b in sorted(glob.glob(sys.argv[1]+'/runs/*.before.json')):
    a=b.replace('.before','.after'); B=json.load(open(b)); A=json.load(open(a))
    for i,mc in enumerate(A['models']):
        if len(A['models'])>1 and mc['model']!='large': continue
        sc=mc['stats']; sp=B['models'][i]['stats']
        d=lambda k:[x-(sp[k][j] if j<len(sp[k]) else 0) for j,x in enumerate(sc[k])]
        st,se,tk=d('steps_by_tokens'),d('seconds_by_tokens'),d('tokens_by_bucket')
        busy=(sc['busy']['secs']+sc['busy']['nanos']/1e9)-(sp['busy']['secs']+sp['busy']['nanos']/1e9)
        print(b.split('/')[-1][:-12], mc['model'], f"busy {busy:.1f}s steps {sum(st)} tokens {sum(tk)}")
        for j in range(len(st)):
            if st[j]: print(f"   tokens {lab(j):>8}: steps {st[j]:5d} tokens {tk[j]:6d} s {se[j]:6.2f} ms/step {1000*se[j]/st[j]:6.1f} ms/token {1000*se[j]/max(tk[j],1):5.2f}")
        sr,ss=d('steps_by_rows'),d('seconds_by_rows')
        print('   by rows:', ' '.join(f"{r}:{sr[r]}/{1000*ss[r]/sr[r]:.1f}ms" for r in range(len(sr)) if sr[r]))
